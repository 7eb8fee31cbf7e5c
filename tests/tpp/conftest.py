"""Fixtures of the pace-tpp tests: skip everything unless the plugin and its glue work here."""

from __future__ import annotations

import pytest
from support.plugin_tests import fresh_host as _fresh_host
from support.plugin_tests import require_glue


@pytest.fixture(scope="session", autouse=True)
def tpp_glue():
    return require_glue("pace_tpp", "pace-tpp", "unavailable_reason", "load")


@pytest.fixture(autouse=True)
def fresh_host(monkeypatch: pytest.MonkeyPatch):
    yield from _fresh_host(monkeypatch, ("PACE_TPP_BN", "PACE_TPP_BK", "PACE_TPP_BM"))


@pytest.fixture(scope="session")
def tiny_llama(odd_llama_dir):
    return odd_llama_dir
