"""The machine pace runs on and where its processes go.

* :mod:`~pace_core.platform.topology`: NUMA nodes, L3 domains, physical cores and SMT
  siblings, as this process may use them (re-exported here);
* :mod:`~pace_core.platform.placement`: launch plans, the cores, node and OpenMP team of each
  engine instance or tensor-parallel rank;
* :mod:`~pace_core.platform.binding`: applying a plan to the calling process.
"""

from pace_core.platform.topology import (
    Core,
    L3Domain,
    NumaNode,
    Topology,
    current_topology,
    format_cpus,
    parse_cpulist,
    read_topology,
)

__all__ = [
    "Core",
    "L3Domain",
    "NumaNode",
    "Topology",
    "current_topology",
    "format_cpus",
    "parse_cpulist",
    "read_topology",
]
