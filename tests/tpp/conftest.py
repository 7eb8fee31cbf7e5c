"""Fixtures of the pace-tpp tests: skip everything unless the plugin and its glue work here
and the CPU has what its kernels need."""

from __future__ import annotations

import pytest
from support.plugin_tests import fresh_host as _fresh_host
from support.plugin_tests import require_glue

from pace_core.cpu import detect_cpu


@pytest.fixture(scope="session", autouse=True)
def tpp_glue():
    plugin = pytest.importorskip("pace_tpp.plugin", reason="pip install -e plugins/tpp")
    missing = sorted(set(plugin.CPU_FEATURES) - detect_cpu().features)
    if missing:
        pytest.skip(f"pace-tpp kernels need {', '.join(missing)}, which this CPU lacks")
    return require_glue("pace_tpp", "pace-tpp", "unavailable_reason", "load")


@pytest.fixture(autouse=True)
def fresh_host(monkeypatch: pytest.MonkeyPatch):
    yield from _fresh_host(monkeypatch, ("PACE_TPP_BN", "PACE_TPP_BK", "PACE_TPP_BM"))


@pytest.fixture(scope="session")
def tiny_llama(odd_llama_dir):
    return odd_llama_dir
