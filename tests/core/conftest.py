"""Fixtures of the plugin-core tests: the out-of-tree test plugins and a clean plugin host."""

from __future__ import annotations

import importlib.metadata as metadata
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.plugins import PLUGIN_DIR, installed_for_session

from pace_core import plugins

TEST_PLUGINS = {  # distribution -> (source dir, top-level package)
    "pace-example": (PLUGIN_DIR / "pace_example", "pace_example"),
    "pace-broken": (PLUGIN_DIR / "pace_broken", "pace_broken"),
}
PACE_ENV = (
    "PACE_DISABLE_PLUGINS", "PACE_DISABLE_PLUGIN_AUTOLOAD", "PACE_PLUGINS",
    "PACE_CPU_FEATURES", "PACE_CPU_FEATURES_DISABLE", "PACE_OPCONFIG",
)  # fmt: skip


@pytest.fixture(scope="session", autouse=True)
def test_plugins(tmp_path_factory) -> Iterator[dict[str, tuple[Path, str]]]:
    """The example and broken plugins, installed for this session only (support/plugins.py)."""
    target = tmp_path_factory.mktemp("test-plugins")
    with installed_for_session([source for source, _ in TEST_PLUGINS.values()], target):
        plugins.reset_host()
        yield TEST_PLUGINS
    plugins.reset_host()


@pytest.fixture(autouse=True)
def clean_host(monkeypatch: pytest.MonkeyPatch):
    """Each test starts and ends with no loaded host and no PACE_* variables set."""
    for name in PACE_ENV:
        monkeypatch.delenv(name, raising=False)
    # Hermetic: only native and the two test plugins, whatever else the venv has installed.
    real_entry_points = metadata.entry_points

    def entry_points(**kw):
        found = real_entry_points(**kw)
        if kw.get("group") == plugins.ENTRY_POINT_GROUP:
            return [ep for ep in found if ep.name in ("native", "example", "broken")]
        return found

    monkeypatch.setattr(plugins.metadata, "entry_points", entry_points)
    plugins.reset_host()
    yield
    plugins.reset_host()
