"""Fixtures of the DLRM tests: a clean PACE_* environment for every test."""

from __future__ import annotations

import pytest

from pace_core import plugins
from pace_core.cpu import detect_cpu

PACE_ENV = ("PACE_DISABLE_PLUGINS", "PACE_DISABLE_PLUGIN_AUTOLOAD", "PACE_PLUGINS",
            "PACE_CPU_FEATURES", "PACE_CPU_FEATURES_DISABLE", "PACE_OPCONFIG",
            "PACE_QUANT_ACTIVATIONS")  # fmt: skip


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch):
    """No PACE_* overrides, the other kernel plugins disabled (fallbacks end at native), a
    fresh CPU probe and plugin host before and after each test."""
    for name in PACE_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PACE_DISABLE_PLUGINS", "onednn,tpp")
    detect_cpu.cache_clear()
    plugins.reset_host()
    yield monkeypatch
    detect_cpu.cache_clear()
    plugins.reset_host()
