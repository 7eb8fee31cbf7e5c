"""Whether this CPU can run pace-avx512's kernels: one skip rule for every test that needs them.

They run on AVX-512 CPUs and, through the ``avx2`` build target, on AVX2 + FMA + F16C ones;
elsewhere (or without the plugin) the tests that need them skip with the reason.
"""

from __future__ import annotations

import importlib.util

import pytest


def avx512_unavailable(int8: bool = False) -> str | None:
    """Why pace-avx512's kernels (with ``int8``: its vpdpbusd ones) cannot run here, or None."""
    if importlib.util.find_spec("pace_avx512") is None:
        return "pace-avx512 is not installed (pip install --no-deps -e plugins/avx512)"
    from pace_avx512 import build

    if build.target() is None:
        return f"pace-avx512 needs a CPU with {', '.join(build.AVX2_FEATURES)}"
    return build.int8_dot_problem() if int8 else None


def require_avx512(int8: bool = False) -> None:
    """Skip the calling test (or, at module level, its module) unless the kernels can run."""
    reason = avx512_unavailable(int8)
    if reason:
        pytest.skip(reason, allow_module_level=True)


# For tests of the int8 (vpdpbusd) kernels: the quantized GEMMs, W8A8, the DLRM's int8 path.
needs_avx512_int8 = pytest.mark.skipif(avx512_unavailable(int8=True) is not None,
                                       reason=str(avx512_unavailable(int8=True)))  # fmt: skip
