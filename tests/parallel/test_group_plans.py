"""Where tensor-parallel ranks run (``pace serve --tensor-parallel N``), on recorded
topologies: one rank per NUMA node with ``--instances auto``, ``I x N`` core groups with
``--instances I``, and errors for plans that do not form whole groups."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pace_core.errors import ConfigError
from pace_core.platform import read_topology
from pace_core.server.launch.cli import add_serve_parser
from pace_core.server.launch.tensor_parallel import group_engines, plan_groups

DATA = Path(__file__).resolve().parents[1] / "platform" / "data"


def topo(name):
    return read_topology(DATA / name)


def test_auto_puts_one_rank_on_each_node():
    (group,) = plan_groups(topo("xeon-2s-snc"), 4, "auto")  # 4 SNC nodes: one group of 4
    assert [p.numa_node for p in group] == [0, 1, 2, 3]
    assert [p.cores for p in group] == [tuple(range(16 * i, 16 * i + 16)) for i in range(4)]
    groups = plan_groups(topo("xeon-2s-snc"), 2, "auto")  # data parallel x tensor parallel
    assert [[p.numa_node for p in g] for g in groups] == [[0, 1], [2, 3]]


def test_instances_times_ranks():
    groups = plan_groups(topo("epyc-9354"), 2, 2)  # 32 cores: 2 groups of 2 ranks of 8
    assert [[len(p.cores) for p in g] for g in groups] == [[8, 8], [8, 8]]
    assert len({c for g in groups for p in g for c in p.cores}) == 32
    engines = group_engines({"model": "m"}, groups, None)
    assert [e.model_args["tensor_parallel"].size for e in engines] == [2, 2]
    assert engines[1].plan == groups[1][0]  # the engine process is its group's rank 0
    assert engines[0].model_args["tensor_parallel"].exit_on_failure


def test_plans_that_do_not_form_groups():
    with pytest.raises(ConfigError, match="--tensor-parallel 2: --instances auto gives 1"):
        plan_groups(topo("this-machine"), 2, "auto")  # one node: one plan
    with pytest.raises(ConfigError, match="3 --instance-cores lists, not a multiple of 2"):
        plan_groups(topo("epyc-9354"), 2, 1, [[0], [1], [2]])


def test_serve_option():
    sub = argparse.ArgumentParser().add_subparsers()
    parser = add_serve_parser(sub)
    assert parser.parse_args(["m", "--tensor-parallel", "2"]).tensor_parallel == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["m", "--tensor-parallel", "0"])


def test_more_ranks_than_cores_names_both_flags():
    cores = len(topo("epyc-9354").cores)
    with pytest.raises(ConfigError, match=rf"--tensor-parallel 3 x --instances 11 = 33 ranks .* "
                       rf"only {cores} physical core"):  # fmt: skip
        plan_groups(topo("epyc-9354"), 3, 11)


def test_a_size_the_model_does_not_split_into_is_refused_before_any_process(smollm2_dir):
    """(In a group's process the error only ended it, and the group restarted forever.)"""
    from pace_core.server.launch.tensor_parallel import check_model

    with pytest.raises(ConfigError, match="valid tensor_parallel sizes for this model are 1, 3"):
        check_model(str(smollm2_dir), 2)
    check_model(str(smollm2_dir), 3)
