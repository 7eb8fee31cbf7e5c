"""``pace build-kernels``: plugins' build steps, kept even when their other hooks fail."""

from __future__ import annotations

import pytest

from pace_core import hookimpl
from pace_core.builds import outcomes_table, run_builds
from pace_core.errors import ConfigError
from pace_core.ops import CONTRACT_VERSION
from pace_core.plugins import PluginHost
from pace_core.registry import BuildNotApplicable


class Builds:
    """A plugin whose ops hook fails (like a JIT backend whose last build failed)."""
    PACE_CONTRACT_VERSION = CONTRACT_VERSION


    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def pace_register_builds(self, registry):
        def good() -> str:
            self.calls += 1
            return "/cache/good"

        def skip() -> str:
            raise BuildNotApplicable("this CPU has no XYZ")

        def bad() -> str:
            raise RuntimeError("g++: internal compiler error\nsecond line")

        registry.add_build("good", good)
        registry.add_build("skip", skip)
        registry.add_build("bad", bad)

    @hookimpl
    def pace_register_ops(self, registry):
        raise RuntimeError("previous build failed")


@pytest.fixture
def host():
    h = PluginHost(autoload=False)
    plugin = Builds()
    info = h.register(plugin, name="jit")
    assert info.status == "failed"  # the ops hook raised ...
    return h, plugin


def test_build_steps_survive_a_failed_plugin_and_report_each_outcome(host):
    h, plugin = host
    assert sorted(h.builds) == ["bad", "good", "skip"]  # ... the build steps stay
    outcomes = {o.backend: o for o in run_builds(h)}
    assert plugin.calls == 1
    assert (outcomes["good"].status, outcomes["good"].detail) == ("ok", "/cache/good")
    assert (outcomes["skip"].status, outcomes["skip"].detail) == ("skipped", "this CPU has no XYZ")
    assert (
        outcomes["bad"].status == "failed" and "internal compiler error" in outcomes["bad"].detail
    )
    table = outcomes_table(list(outcomes.values()))
    assert "second line" not in table and "failed" in table and "jit" in table


def test_selected_and_unknown_backends(host):
    h, plugin = host
    assert [o.backend for o in run_builds(h, ["good"])] == ["good"]
    with pytest.raises(ConfigError, match="no build step for backend.*nope.*have: bad, good, skip"):
        run_builds(h, ["nope"])
    assert plugin.calls == 1  # nothing ran for the bad request


def test_duplicate_build_step_is_rejected_without_losing_the_first():
    h = PluginHost(autoload=False)

    class One:
        PACE_CONTRACT_VERSION = CONTRACT_VERSION

        @hookimpl
        def pace_register_builds(self, registry):
            registry.add_build("x", lambda: "first")

    class Two:
        PACE_CONTRACT_VERSION = CONTRACT_VERSION

        @hookimpl
        def pace_register_builds(self, registry):
            registry.add_build("x", lambda: "second")

    h.register(One(), name="one")
    h.register(Two(), name="two")
    assert h.builds["x"].plugin == "one"
    assert run_builds(h, ["x"])[0].detail == "first"
