"""What a tensor-parallel load asks for: :class:`TensorParallelConfig`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pace_core.errors import ConfigError
from pace_core.platform.placement import InstancePlan

ALL_REDUCES = ("shm", "gloo")


@dataclass(frozen=True)
class TensorParallelConfig:
    """``size`` ranks, one process each; rank 0 is the process that loads the model.

    ``plans``: where each rank runs (one :class:`InstancePlan` per rank; default: the
    machine's physical cores split ``size`` ways, as ``--instances size``); ``bind``: pin
    each rank (rank 0 too) to its plan's cores and memory; ``exit_on_failure``: when another
    rank dies, end rank 0's process (a served instance, which its supervisor restarts with
    its group) instead of failing the steps that follow; ``all_reduce``: ``"shm"`` (the
    ranks' shared memory, :mod:`~pace_core.parallel.shm`; gloo for tensors larger than its
    slots) or ``"gloo"`` (always torch.distributed's gloo over TCP).
    """

    size: int = 1
    plans: tuple[InstancePlan, ...] | None = None
    bind: bool = True
    exit_on_failure: bool = False
    all_reduce: str = "shm"

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or self.size < 1:
            raise ConfigError(f"tensor_parallel must be an integer >= 1 (got {self.size!r})")
        if self.all_reduce not in ALL_REDUCES:
            raise ConfigError(
                f"all_reduce {self.all_reduce!r}: use one of {', '.join(ALL_REDUCES)}"
            )
        if self.plans is not None and len(self.plans) != self.size:
            raise ConfigError(
                f"tensor_parallel={self.size} with {len(self.plans)} rank plans: give one per rank"
            )

    @classmethod
    def coerce(cls, value: int | TensorParallelConfig | None) -> TensorParallelConfig:
        if value is None:
            return cls()
        if isinstance(value, TensorParallelConfig):
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(
                f"tensor_parallel must be an int or a TensorParallelConfig (got {value!r})"
            )
        return cls(value)

    def rank_plans(self) -> Sequence[InstancePlan]:
        """One plan per rank: the given ones, or this machine's cores split ``size`` ways."""
        if self.plans is not None:
            return self.plans
        from pace_core.platform import current_topology
        from pace_core.platform.placement import plan_instances

        topology = current_topology()
        cores = topology.physical_cpus()
        if self.size > len(cores):
            raise ConfigError(
                f"tensor_parallel={self.size}: a rank per physical core at least, and this "
                f"process may use {len(cores)}; use at most {len(cores)}, or give the ranks "
                "their CPUs: TensorParallelConfig(size, plans=[...])"
            )
        return plan_instances(topology, self.size)
