"""The topology reader on recorded sysfs trees (data/, written by data/make_trees.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pace_core.platform import format_cpus, parse_cpulist, read_topology

DATA = Path(__file__).resolve().parent / "data"


def test_cpulist_round_trip():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []
    assert format_cpus([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"


def test_epyc_one_socket_eight_ccds():
    topo = read_topology(DATA / "epyc-9354")
    assert len(topo.cpus) == 64 and topo.online == 64
    assert [n.id for n in topo.nodes] == [0] and topo.numa_reported
    assert topo.nodes[0].memory_kb == 395_845_132
    assert len(topo.cores) == 32 and topo.smt and topo.packages == 1
    assert topo.cores[5].cpus == (5, 37)  # siblings n and n+32
    assert len(topo.l3) == 8
    for k, domain in enumerate(topo.l3):
        assert domain.size_kb == 32768
        assert topo.physical_cpus(domain.cpus) == list(range(4 * k, 4 * k + 4))
    assert topo.physical_cpus() == list(range(32))


def test_xeon_two_sockets_with_snc():
    topo = read_topology(DATA / "xeon-2s-snc")  # thread_siblings_list only (kernel 4.18)
    assert [n.id for n in topo.nodes] == [0, 1, 2, 3]
    assert topo.packages == 2 and len(topo.cores) == 64
    for i, node in enumerate(topo.nodes):
        assert topo.physical_cpus(node.cpus) == list(range(16 * i, 16 * i + 16))
        assert set(node.cpus) == set(range(16 * i, 16 * i + 16)) | set(
            range(64 + 16 * i, 80 + 16 * i)
        )
    # one L3 per socket, each spanning two SNC nodes
    assert [len(topo.physical_cpus(d.cpus)) for d in topo.l3] == [32, 32]
    assert {c.package for c in topo.cores if c.primary >= 32} == {1}


def test_container_cgroup_cpuset():
    topo = read_topology(DATA / "container-2s")  # cgroup v2 cpuset 2-5,18-19
    assert topo.cpus == (2, 3, 4, 5, 18, 19) and topo.online == 32
    assert [n.id for n in topo.nodes] == [0]  # node 1 has no allowed CPU
    assert [c.cpus for c in topo.cores] == [(2, 18), (3, 19), (4,), (5,)]
    assert [d.cpus for d in topo.l3] == [(2, 3, 4, 5, 18, 19)]
    assert "6 of 32 CPUs allowed = 4 physical cores" in topo.summary()


def test_affinity_mask_restricts_too():
    """A taskset mask (``allowed``) spanning both nodes, intersected with the cgroup."""
    topo = read_topology(DATA / "container-2s", allowed=[3, 4, 9, 19, 20])
    assert topo.cpus == (3, 4, 19)
    topo = read_topology(DATA / "xeon-2s-snc", allowed=[*range(12, 20), 76])
    assert [(n.id, n.cpus) for n in topo.nodes] == [
        (0, (12, 13, 14, 15, 76)),
        (1, tuple(range(16, 20))),
    ]
    assert topo.cores[0].cpus == (12, 76)


def test_this_machine_recorded():
    topo = read_topology(DATA / "this-machine")
    assert topo.cpus == (0, 1) and len(topo.nodes) == 1 and not topo.smt
    assert [d.cpus for d in topo.l3] == [(0, 1)]


def test_no_numa_nodes_is_one_node(tmp_path):
    """sysfs without /sys/devices/system/node: one node with every allowed CPU."""
    cpu = tmp_path / "sys/devices/system/cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("0-3\n")
    topo = read_topology(tmp_path)
    assert [(n.id, n.cpus, n.memory_kb) for n in topo.nodes] == [(0, (0, 1, 2, 3), None)]
    assert not topo.numa_reported and topo.l3 == ()
    assert [c.cpus for c in topo.cores] == [(0,), (1,), (2,), (3,)]  # no topology files
    assert "sysfs reports none" in topo.summary()


def test_live_machine_matches_affinity():
    topo = read_topology()
    assert set(topo.cpus) == set(os.sched_getaffinity(0))
    assert sum(len(n.cpus) for n in topo.nodes) == len(topo.cpus)


@pytest.mark.parametrize("name", ["epyc-9354", "xeon-2s-snc", "container-2s", "this-machine"])
def test_every_cpu_in_one_core_and_one_node(name):
    topo = read_topology(DATA / name)
    in_cores = [c for core in topo.cores for c in core.cpus]
    in_nodes = [c for node in topo.nodes for c in node.cpus]
    assert sorted(in_cores) == sorted(in_nodes) == list(topo.cpus)
