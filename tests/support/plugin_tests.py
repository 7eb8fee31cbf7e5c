"""Shared pieces of the kernel-plugin test suites (tests/tpp, tests/onednn): the
glue-or-skip check and a clean plugin host per test."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable, Iterator
from types import ModuleType

import pytest
import torch

from pace_core import plugins

SELECTION_VARS = ("PACE_DISABLE_PLUGINS", "PACE_DISABLE_PLUGIN_AUTOLOAD", "PACE_PLUGINS",
                  "PACE_OPCONFIG", "PACE_CPU_FEATURES", "PACE_CPU_FEATURES_DISABLE")  # fmt: skip


def require_glue(package: str, dist: str, unavailable: str, load: str) -> ModuleType:
    """``package.build``'s glue module (built on first use), or skip with the reason."""
    if importlib.util.find_spec(package) is None:
        pytest.skip(
            f"{dist} is not installed (pip install -e plugins/{dist.removeprefix('pace-')})"
        )
    build = importlib.import_module(f"{package}.build")
    reason = getattr(build, unavailable)()
    if reason:
        pytest.skip(f"{dist} unavailable: {reason}")
    return getattr(build, load)()


def fresh_host(monkeypatch: pytest.MonkeyPatch, extra: Iterable[str] = ()) -> Iterator[None]:
    """No PACE_* selection variables leak in; the test sees a freshly loaded plugin host."""
    for name in (*SELECTION_VARS, *extra):
        monkeypatch.delenv(name, raising=False)
    plugins.reset_host()
    yield
    plugins.reset_host()


def rand(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    """Seeded N(0, scale) fp32 tensor."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def assert_close(got: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    """Max error within ``tol`` of the reference's largest magnitude."""
    assert got.shape == ref.shape
    scale = max(float(ref.abs().max()), 1e-6)
    err = float((got.float() - ref.float()).abs().max())
    assert err <= tol * scale, f"max error {err:.3g} > {tol:.3g} * {scale:.3g}"
