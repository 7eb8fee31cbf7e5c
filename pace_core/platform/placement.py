"""The launch plan: which cores, NUMA node and OpenMP team each engine instance gets.

A pure function of the machine's :class:`~pace_core.platform.Topology` and what was asked:

- ``N`` instances: the allowed physical cores (one thread per core: the first SMT sibling),
  ordered by NUMA node, split into N contiguous groups of (nearly) equal size;
- ``"auto"``: one instance per NUMA node, on that node's physical cores (one node: one
  instance, as ``--instances 1``);
- ``"auto-l3"``: one instance per L3 domain (within a node: on a Xeon with sub-NUMA clustering
  an L3 spans two nodes, each half is its own instance); a choice to measure on EPYCs, where
  a CCD's cores share one L3 and the whole socket is one node;
- explicit ``instance_cores`` lists: used as given (any CPUs of the allowed set).

An instance whose cores all sit in one node, on a machine with more than one, is bound to
that node's memory (``numa_node``); otherwise ``numa_node`` is None (the kernel's default
local allocation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pace_core.errors import ConfigError
from pace_core.platform import Topology, format_cpus

__all__ = ["AUTO_MODES", "InstancePlan", "parse_instances", "plan_instances", "plan_replica"]

AUTO_MODES = {"auto": "one per NUMA node", "auto-l3": "one per L3 domain"}
_CHOICES = "a count >= 1, 'auto' (one instance per NUMA node) or 'auto-l3' (one per L3 domain)"


@dataclass(frozen=True)
class InstancePlan:
    """Where one engine instance runs."""

    cores: tuple[int, ...]  # CPUs it is pinned to
    numa_node: int | None  # node its memory is bound to (None: not bound)
    omp_threads: int  # its OpenMP / torch intra-op team

    def describe(self) -> str:
        node = "" if self.numa_node is None else f", node {self.numa_node}"
        return f"cpus {format_cpus(self.cores)} ({self.omp_threads} threads{node})"


def parse_instances(value: str | int) -> int | str:
    """``--instances``: a count >= 1, ``"auto"`` or ``"auto-l3"``; ConfigError otherwise."""
    text = str(value).strip().lower()
    if text in AUTO_MODES:
        return text
    try:
        count = int(text)
    except ValueError:
        raise ConfigError(f"--instances {value!r}: expected {_CHOICES}") from None
    if count < 1:
        raise ConfigError(f"--instances {value!r}: expected {_CHOICES}")
    return count


def plan_instances(
    topology: Topology,
    instances: int | str = 1,
    instance_cores: Sequence[Sequence[int]] | None = None,
) -> list[InstancePlan]:
    """The instances to start on ``topology``; ConfigError naming the bad value and the fix."""
    instances = parse_instances(instances)
    if instance_cores:
        if instances not in (1, len(instance_cores)):
            raise ConfigError(
                f"--instances {instances} with {len(instance_cores)} --instance-cores lists: "
                f"drop --instances (the lists set the count) or pass {len(instance_cores)}"
            )
        groups = [_explicit(topology, cores) for cores in instance_cores]
    elif instances == "auto":
        groups = [topology.physical_cpus(node.cpus) for node in topology.nodes]
    elif instances == "auto-l3":
        groups = [
            topology.physical_cpus(set(domain.cpus) & set(node.cpus))
            for node in topology.nodes
            for domain in topology.l3 or [node]
        ]
        groups = [g for g in groups if g]
    else:
        groups = _split(topology.physical_cpus(), int(instances))
    return [InstancePlan(tuple(g), _node_of(topology, g), len(g)) for g in groups]


def plan_replica(topology: Topology, rank: int, threads: int) -> InstancePlan | None:
    """Where Ray replica ``rank`` of ``threads`` threads runs on its machine: the ``rank``-th
    group of ``threads`` physical cores (in node order); None when the machine has too few."""
    cores = topology.physical_cpus()
    group = cores[rank * threads : (rank + 1) * threads]
    if threads < 1 or len(group) < threads:
        return None
    return InstancePlan(tuple(group), _node_of(topology, group), threads)


def _explicit(topology: Topology, cores: Sequence[int]) -> list[int]:
    shown = format_cpus(cores)
    if not cores:
        raise ConfigError("--instance-cores: an empty list; give each instance CPUs, e.g. 0-3")
    outside = sorted(set(cores) - set(topology.cpus))
    if outside:
        raise ConfigError(
            f"--instance-cores {shown}: CPU(s) {format_cpus(outside)} not allowed for this "
            f"process (allowed: {format_cpus(topology.cpus)}); pick CPUs from the allowed set"
        )
    return sorted(set(cores))


def _split(cores: list[int], instances: int) -> list[list[int]]:
    if instances > len(cores):
        raise ConfigError(
            f"--instances {instances}: only {len(cores)} physical core(s) allowed "
            f"({format_cpus(cores)}); use at most {len(cores)}, or --instance-cores to "
            "share cores on purpose"
        )
    size, extra = divmod(len(cores), instances)
    out, start = [], 0
    for i in range(instances):
        n = size + (1 if i < extra else 0)
        out.append(cores[start : start + n])
        start += n
    return out


def _node_of(topology: Topology, cores: Sequence[int]) -> int | None:
    """The node holding all ``cores`` when the machine has more than one node, else None."""
    if not topology.numa_reported or len(topology.nodes) < 2:
        return None
    wanted = set(cores)
    nodes = [n.id for n in topology.nodes if wanted & set(n.cpus)]
    return nodes[0] if len(nodes) == 1 else None
