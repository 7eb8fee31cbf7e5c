"""Fixtures of the pace-avx512 tests: the kernels built once per session, a clean PACE_* env.

Each test module skips itself (module level, with the reason) on a CPU without AVX-512 or
when pace-avx512 is not installed; on a CPU without AVX512-BF16 the bf16 cases skip (the
hook below: a test parametrized with bfloat16, or naming bf16), and the fp32 ones run.

The first session on a machine compiles the extension (~20-60 s on 2 busy cores); later
sessions import the cached build from ``$PACE_CACHE_DIR/kernels/``.
"""

from __future__ import annotations

import pytest
import torch

from pace_core import plugins
from pace_core.cpu import detect_cpu

PACE_ENV = (
    "PACE_DISABLE_PLUGINS", "PACE_DISABLE_PLUGIN_AUTOLOAD", "PACE_PLUGINS",
    "PACE_CPU_FEATURES", "PACE_CPU_FEATURES_DISABLE", "PACE_OPCONFIG", "PACE_AVX512_EAGER",
)  # fmt: skip


# Other first-party kernel plugins that may be installed alongside are disabled: fallbacks
# then go to native (the end of every chain), and their own JIT builds stay out of these tests.
OTHER_KERNEL_PLUGINS = "onednn,tpp"


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


def _wants_bf16(item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return "bf16" in item.name.lower() or any(
        v is torch.bfloat16 or v == "bfloat16" for v in params.values()
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if detect_cpu().has("avx512_bf16"):
        return
    skip = pytest.mark.skip(reason="bf16 kernels need an AVX512-BF16 CPU (vdpbf16ps)")
    for item in items:
        if "tests/avx512/" in str(item.path) and _wants_bf16(item):
            item.add_marker(skip)
