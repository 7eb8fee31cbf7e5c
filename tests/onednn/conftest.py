"""Fixtures of the pace-onednn tests: skip unless the plugin and its glue work here."""

from __future__ import annotations

import pytest
from support.plugin_tests import fresh_host as _fresh_host
from support.plugin_tests import require_glue


@pytest.fixture(scope="session", autouse=True)
def onednn_glue():
    return require_glue("pace_onednn", "pace-onednn", "unavailable", "extension")


@pytest.fixture(autouse=True)
def fresh_host(monkeypatch: pytest.MonkeyPatch):
    yield from _fresh_host(monkeypatch)


@pytest.fixture(scope="session")
def tiny_llama(odd_llama_dir):
    return odd_llama_dir
