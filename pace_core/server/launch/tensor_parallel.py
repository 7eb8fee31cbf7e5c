"""``pace serve --tensor-parallel N``: tensor-parallel groups as the server's engine instances.

The launch plan is the instances' (:func:`~pace_core.platform.placement.plan_instances`),
one plan per *rank*: ``--instances I`` asks for ``I x N`` core groups, ``auto`` for one per
NUMA node (``auto-l3``: per L3 domain), ``--instance-cores`` lists one per rank; consecutive
plans form a group (data parallel x tensor parallel). Each group is one
:class:`~pace_core.server.launch.multi.ProcessEngine`: its process is rank 0, which starts
the group's other ranks and ends itself when one of them dies, so the front door fails that
group's requests alone (503, retry) and restarts the group while the others serve.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pace_core.errors import ConfigError
from pace_core.parallel.config import TensorParallelConfig
from pace_core.platform import Topology, format_cpus
from pace_core.platform.placement import InstancePlan, plan_instances


def plan_groups(
    topology: Topology,
    size: int,
    instances: int | str = 1,
    instance_cores: Sequence[Sequence[int]] | None = None,
) -> list[tuple[InstancePlan, ...]]:
    """The rank plans of each group: ``instances`` groups of ``size`` ranks (see the module
    doc); ConfigError when the plans do not form whole groups."""
    asked: int | str = instances * size if isinstance(instances, int) else instances
    if instance_cores:
        asked = len(instance_cores)
    if isinstance(asked, int) and asked > len(topology.cores):
        raise ConfigError(
            f"--tensor-parallel {size} x --instances {instances} = {asked} ranks of at least "
            f"one core each, but only {len(topology.cores)} physical core(s) are allowed "
            f"({format_cpus(topology.cpus)}): use fewer, or --instance-cores to share cores"
        )
    plans = plan_instances(topology, asked, instance_cores)
    if len(plans) % size:
        where = (
            f"{len(plans)} --instance-cores lists" if instance_cores
            else f"--instances {instances} gives {len(plans)} rank plan(s)"
        )  # fmt: skip
        raise ConfigError(
            f"--tensor-parallel {size}: {where}, not a multiple of {size} (one plan per rank: "
            f"this machine's NUMA nodes: {len(topology.nodes)}, allowed CPUs "
            f"{format_cpus(topology.cpus)})"
        )
    return [tuple(plans[i : i + size]) for i in range(0, len(plans), size)]


def check_model(model: str, size: int) -> None:
    """ConfigError unless the model splits ``size`` ways, before any process starts (in a
    group's process the same error would only end it, and the group be restarted forever)."""
    from pathlib import Path

    from pace_core.models.loader import load_config
    from pace_core.parallel.shard import check

    check(load_config(Path(model)), size)


def group_engines(
    model_args: dict[str, Any], groups: Sequence[tuple[InstancePlan, ...]], engine_config: Any
) -> list[Any]:
    """One engine process per group (rank 0 placed by the group's first plan)."""
    from pace_core.server.launch.multi import ProcessEngine

    engines = []
    for i, plans in enumerate(groups):
        tp = TensorParallelConfig(len(plans), plans=plans, exit_on_failure=True)
        engines.append(ProcessEngine(str(i), {**model_args, "tensor_parallel": tp},
                                     engine_config, plans[0]))  # fmt: skip
    return engines


def tensor_parallel_server(
    model_args: dict[str, Any],
    groups: Sequence[tuple[InstancePlan, ...]],
    engine_config: Any,
    config: Any,
) -> Any:
    """The front door over the groups' engine processes."""
    from pace_core.server.frontdoor.server import Server, resolved_model_args

    model_args = resolved_model_args(model_args)
    check_model(model_args["model"], len(groups[0]))
    engines = group_engines(model_args, groups, engine_config)
    return Server.for_engines(model_args, engines, engine_config, config)
