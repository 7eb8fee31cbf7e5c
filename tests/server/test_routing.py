"""Cache-aware routing: requests sharing a prefix go to the instance that computed it, unless
it is much busier; the front door follows the router."""

from __future__ import annotations

from support.fake_instances import FakeInstance

from pace_core.engine.events import SeqSpec
from pace_core.sampling import SamplingConfig
from pace_core.server.frontdoor.frontend import Frontend
from pace_core.server.frontdoor.metrics import Metrics
from pace_core.server.frontdoor.routing import PrefixRouter

SHARED = list(range(1000, 1200))  # 3 full routing blocks


def test_router_prefers_the_prefix_holder_within_the_slack():
    router = PrefixRouter(slack=2)
    load = {0: 0, 1: 0, 2: 0}
    assert router.choose([*SHARED, 1], "", [0, 1, 2], load.get) == 0
    router.record(1, [*SHARED, 1], "")
    load.update({1: 2})
    assert router.choose([*SHARED, 2], "", [0, 1, 2], load.get) == 1  # within the slack
    load.update({1: 3})
    assert router.choose([*SHARED, 2], "", [0, 1, 2], load.get) == 0  # much busier
    assert router.choose([*SHARED, 2], "other-tenant", [0, 2], load.get) == 0
    router.record(2, SHARED[:128], "")
    load.update({1: 0})
    assert router.choose([*SHARED, 3], "", [0, 1, 2], load.get) == 1  # the longest prefix
    router.forget(1)
    assert router.choose([*SHARED, 3], "", [0, 1, 2], load.get) == 2


def test_router_memory_is_bounded():
    router = PrefixRouter(slack=1, capacity=4)
    router.record(0, list(range(64 * 10)), "")
    assert len(router.seen[0]) == 4


def test_frontend_routes_a_shared_prefix_to_one_instance():
    instances = [FakeInstance("0"), FakeInstance("1")]
    front = Frontend(instances, Metrics(), max_running=8, max_queue=64)
    cfg = SamplingConfig(max_new_tokens=4)
    subs = [
        front.submit(f"r{i}", [SeqSpec(f"r{i}:0", [*SHARED, i], cfg)], len(SHARED) + 1)
        for i in range(4)
    ]
    # loads 0..2 on instance 0 stay within the slack of 2; at 3 it is much busier
    assert [s.instance for s in subs] == [0, 0, 0, 1]
    other = front.submit("x", [SeqSpec("x:0", list(range(5000, 5300)), cfg)], 300)
    assert other.instance == 1  # no prefix anywhere: the least loaded
