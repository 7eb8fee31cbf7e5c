"""Whether this CPU can run pace-avx512's kernels: one skip rule for every test that needs them.

The suite runs on any x86-64 CPU: on one without AVX-512 (an AVX2-only Zen 3, say) the
resolver falls back to other backends, and tests of the AVX-512 kernels skip with the reason.
"""

from __future__ import annotations

import importlib.util

import pytest

from pace_core.cpu import detect_cpu


def avx512_unavailable(*extra: str) -> str | None:
    """Why pace-avx512's kernels (and ``extra`` CPU features) cannot run here, or None."""
    if importlib.util.find_spec("pace_avx512") is None:
        return "pace-avx512 is not installed (pip install --no-deps -e plugins/avx512)"
    from pace_avx512 import build

    missing = sorted(set((*build.BASE_FEATURES, *extra)) - detect_cpu().features)
    return f"needs an AVX-512 CPU; this one lacks {', '.join(missing)}" if missing else None


def require_avx512(*extra: str) -> None:
    """Skip the calling test (or, at module level, its module) unless the kernels can run."""
    reason = avx512_unavailable(*extra)
    if reason:
        pytest.skip(f"pace-avx512 {reason}", allow_module_level=True)


needs_avx512 = pytest.mark.skipif(avx512_unavailable() is not None,
                                  reason=f"pace-avx512 {avx512_unavailable()}")  # fmt: skip
needs_avx512_vnni = pytest.mark.skipif(
    avx512_unavailable("avx512_vnni") is not None,
    reason=f"pace-avx512 {avx512_unavailable('avx512_vnni')}",
)
