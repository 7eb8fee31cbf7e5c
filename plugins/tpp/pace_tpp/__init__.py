"""pace-tpp: libxsmm (TPP) BRGEMM kernels for pace's dense ops (see README.md)."""

__version__ = "0.1.0"
