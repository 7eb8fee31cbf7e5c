"""pace-onednn: oneDNN matmul kernels (``linear``, ``gated_mlp``) for pace.

See ``pace_onednn.build`` for how the C++ glue is found, built and cached.
"""

__version__ = "0.1.0"
