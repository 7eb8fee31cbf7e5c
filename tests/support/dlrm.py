"""Shared by the DLRM tests: whether pace-avx512 can run here, and tiny models."""

from __future__ import annotations

import importlib.util

import pytest

from pace_core.cpu import detect_cpu

HAS_AVX512 = detect_cpu().has("avx512f", "avx512bw", "avx512vl", "avx512_vnni") and (
    importlib.util.find_spec("pace_avx512") is not None
)
needs_avx512 = pytest.mark.skipif(not HAS_AVX512, reason="needs pace-avx512 on an AVX-512 CPU")
