"""pace-avx512: AVX-512 / AVX512-BF16 kernels for pace, JIT-built from C++ on first use."""

__version__ = "0.1.0"
