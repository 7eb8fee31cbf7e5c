"""Launch plans (``pace serve --instances``) on the recorded topologies, and applying one."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from pace_core.errors import ConfigError
from pace_core.platform import current_topology, read_topology
from pace_core.platform.binding import prefer_node
from pace_core.platform.placement import (
    InstancePlan,
    parse_instances,
    plan_instances,
    plan_replica,
)
from pace_core.server.launch.cli import add_serve_parser, instance_plans

DATA = Path(__file__).resolve().parent / "data"


def topo(name):
    return read_topology(DATA / name)


def plans(name, instances, cores=None):
    return [
        (p.cores, p.numa_node, p.omp_threads) for p in plan_instances(topo(name), instances, cores)
    ]


def test_auto_on_two_sockets_with_snc_binds_instance_i_to_node_i():
    got = plan_instances(topo("xeon-2s-snc"), "auto")
    assert len(got) == 4
    for i, plan in enumerate(got):
        assert plan.cores == tuple(range(16 * i, 16 * i + 16))  # physical cores, no HT sibling
        assert plan.numa_node == i and plan.omp_threads == 16
    # more instances than nodes: each still inside one node
    assert [p[1] for p in plans("xeon-2s-snc", 8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    # fewer: an instance spanning two nodes is not bound
    assert plans("xeon-2s-snc", 2) == [
        (tuple(range(32)), None, 32),
        (tuple(range(32, 64)), None, 32),
    ]
    # auto-l3: one L3 per socket spans two SNC nodes, so one instance per (L3, node) pair
    assert [p[1] for p in plans("xeon-2s-snc", "auto-l3")] == [0, 1, 2, 3]


def test_auto_on_one_socket_epyc():
    assert plans("epyc-9354", "auto") == [(tuple(range(32)), None, 32)]
    per_ccd = plans("epyc-9354", "auto-l3")
    assert per_ccd == [(tuple(range(4 * k, 4 * k + 4)), None, 4) for k in range(8)]
    assert plans("epyc-9354", 3) == [
        (tuple(range(11)), None, 11),
        (tuple(range(11, 22)), None, 11),
        (tuple(range(22, 32)), None, 10),
    ]


def test_container_plans_use_only_allowed_cores():
    assert plans("container-2s", "auto") == [((2, 3, 4, 5), None, 4)]
    assert plans("container-2s", 2) == [((2, 3), None, 2), ((4, 5), None, 2)]
    assert plans("container-2s", 1, [[2, 18], [3]]) == [((2, 18), None, 2), ((3,), None, 1)]
    with pytest.raises(
        ConfigError, match=r"--instance-cores 0-2: CPU\(s\) 0-1 not allowed.*2-5,18-19"
    ):
        plan_instances(topo("container-2s"), 1, [[0, 1, 2]])


def test_this_machine():
    assert plans("this-machine", "auto") == [((0, 1), None, 2)]
    assert plans("this-machine", 2) == [((0,), None, 1), ((1,), None, 1)]


def test_explicit_lists_pass_through():
    assert plans("xeon-2s-snc", 1, [[0, 64], [16, 17]]) == [((0, 64), 0, 2), ((16, 17), 1, 2)]
    assert plans("xeon-2s-snc", 2, [[0], [1]]) == [((0,), 0, 1), ((1,), 0, 1)]
    with pytest.raises(ConfigError, match="--instances 3 with 2 --instance-cores lists"):
        plan_instances(topo("xeon-2s-snc"), 3, [[0], [1]])
    with pytest.raises(ConfigError, match="--instances auto with 1 --instance-cores"):
        plan_instances(topo("xeon-2s-snc"), "auto", [[0]])


@pytest.mark.parametrize("value", ["0", "-1", "autoo", "two", ""])
def test_bad_instance_values_name_the_value_and_the_fix(value):
    with pytest.raises(ConfigError, match=f"--instances {value!r}: expected a count >= 1, 'auto'"):
        parse_instances(value)


def test_more_instances_than_cores():
    with pytest.raises(ConfigError, match=r"--instances 3: only 2 physical core\(s\).*at most 2"):
        plan_instances(topo("this-machine"), 3)


def _parse(argv):
    parser = argparse.ArgumentParser(prog="pace")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_cli(capsys):
    args = _parse(["serve", "--instances", "AUTO", "--instance-cores", "0", "1"])
    assert args.instances == "auto" and args.instance_cores == [[0], [1]]
    assert instance_plans(_parse(["serve"])) is None  # one engine thread, as always
    if len(current_topology().nodes) == 1:  # auto on one node: as --instances 1
        assert instance_plans(_parse(["serve", "--instances", "auto"])) is None
    assert instance_plans(_parse(["serve", "--instance-cores", "0"])) == [
        InstancePlan((0,), None, 1)
    ]
    for argv, shown in ((["--instances", "autoo"], "'autoo'"), (["--instance-cores", "x"], "'x'")):
        with pytest.raises(SystemExit):
            _parse(["serve", *argv])
        assert shown in capsys.readouterr().err


def test_prefer_node_binds_the_thread_and_its_children():
    code = (
        "import threading\n"
        "from pace_core.platform.binding import apply_plan\n"
        "from pace_core.platform.placement import InstancePlan\n"
        "apply_plan(InstancePlan((0,), 0, 1), 'x')\n"
        "import os; assert os.sched_getaffinity(0) == {0}\n"
        "out = []\n"
        "read = lambda: out.append(open('/proc/thread-self/numa_maps').read())\n"
        "t = threading.Thread(target=read)\n"
        "t.start(); t.join()\n"
        "assert ' prefer:0 ' in out[0], out[0][:200]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_prefer_node_failure_is_a_warning(caplog):
    assert prefer_node(4095) is False  # no such node: EINVAL, logged, nothing raised
    assert "NUMA node 4095: set_mempolicy failed" in caplog.text


def test_ray_replica_plans():
    xeon = topo("xeon-2s-snc")
    assert [plan_replica(xeon, r, 16).numa_node for r in range(4)] == [0, 1, 2, 3]
    assert plan_replica(xeon, 1, 16).cores == tuple(range(16, 32))
    assert plan_replica(xeon, 0, 24).numa_node is None  # spans two nodes: not bound
    assert plan_replica(topo("epyc-9354"), 7, 4).cores == (28, 29, 30, 31)
    assert plan_replica(topo("epyc-9354"), 8, 4) is None
