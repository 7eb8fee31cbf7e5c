"""pace-native: the torch reference kernels of pace (always installed).

Every other backend is tested against these implementations.
"""

__version__ = "0.1.0"
