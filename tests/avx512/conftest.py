"""Fixtures of the pace-avx512 tests: the kernels built once per session, a clean PACE_* env.

Every test here skips, with the reason, on a CPU without AVX2 + FMA + F16C or when
pace-avx512 is not installed (``support.isa``); on AVX2-only CPUs they run the `avx2` build, and
the int8 modules need AVX512-VNNI on AVX-512 CPUs. bf16 cases run everywhere: with AVX512-BF16
the matmuls use vdpbf16ps, without it they widen bf16 to fp32.

The first session on a machine compiles the extension (~20-60 s on 2 busy cores, ~2 min for
`avx2`); later
sessions import the cached build from ``$PACE_CACHE_DIR/kernels/``.
"""

from __future__ import annotations

import pytest
from support.isa import require_avx512

from pace_core import plugins
from pace_core.cpu import detect_cpu

PACE_ENV = (
    "PACE_DISABLE_PLUGINS", "PACE_DISABLE_PLUGIN_AUTOLOAD", "PACE_PLUGINS",
    "PACE_CPU_FEATURES", "PACE_CPU_FEATURES_DISABLE", "PACE_OPCONFIG", "PACE_AVX512_EAGER",
    "PACE_QUANT_ACTIVATIONS",
)  # fmt: skip


# Other first-party kernel plugins that may be installed alongside are disabled: fallbacks
# then go to native (the end of every chain), and their own JIT builds stay out of these tests.
OTHER_KERNEL_PLUGINS = "onednn,tpp"


@pytest.fixture(scope="session", autouse=True)
def avx512_cpu() -> None:
    """Skip unless this CPU and install can run the kernels (before ``ext`` builds them)."""
    require_avx512()


@pytest.fixture(scope="session")
def ext():
    """The compiled kernel module (built on first use, then cached)."""
    from pace_avx512 import build

    return build.load_extension()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch):
    """No PACE_* overrides but the other kernel plugins disabled; CPU probe and plugin host
    fresh before and after the test."""
    for name in PACE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PACE_DISABLE_PLUGINS", OTHER_KERNEL_PLUGINS)
    detect_cpu.cache_clear()
    plugins.reset_host()
    yield monkeypatch
    detect_cpu.cache_clear()
    plugins.reset_host()

