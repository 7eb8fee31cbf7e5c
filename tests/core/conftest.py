"""Fixtures of the plugin-core tests: the out-of-tree test plugins and a clean plugin host."""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from pace_core import plugins

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "plugins"
TEST_PLUGINS = {  # distribution -> (source dir, top-level package)
    "pace-example": (PLUGIN_DIR / "pace_example", "pace_example"),
    "pace-broken": (PLUGIN_DIR / "pace_broken", "pace_broken"),
}
PACE_ENV = (
    "PACE_DISABLE_PLUGINS", "PACE_DISABLE_PLUGIN_AUTOLOAD", "PACE_PLUGINS",
    "PACE_CPU_FEATURES", "PACE_CPU_FEATURES_DISABLE", "PACE_OPCONFIG",
)  # fmt: skip


def _installed(dist: str) -> bool:
    try:
        metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture(scope="session", autouse=True)
def test_plugins() -> dict[str, tuple[Path, str]]:
    """pip-install the example and broken plugins (editable, once) so their entry points exist."""
    missing = [dist for dist in TEST_PLUGINS if not _installed(dist)]
    if missing:
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q"]
        for dist in missing:
            cmd += ["-e", str(TEST_PLUGINS[dist][0])]
        subprocess.run(cmd, check=True)
        importlib.invalidate_caches()
    # An editable install's import hook is set up at interpreter start-up: in this process,
    # make freshly installed packages importable by path.
    for source, package in TEST_PLUGINS.values():
        if importlib.util.find_spec(package) is None:
            sys.path.append(str(source))
    importlib.invalidate_caches()
    plugins.reset_host()
    return TEST_PLUGINS


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
