"""Per-op profiling: where the time of a forward pass goes, by op and backend.

Enabled per model (``LLMModel(..., profile=True)`` or ``PACE_PROFILE=1``): the builder then
binds timing wrappers around every kernel. Disabled (the default), kernels are bound bare, so
the hot path pays nothing.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from pace_core.ops import OPS


class OpProfiler:
    """Accumulates wall time and call counts per (op, backend)."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, str], float] = defaultdict(float)
        self.calls: dict[tuple[str, str], int] = defaultdict(int)

    def wrap(self, op: str, backend: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        if OPS[op].container:  # its inner ops are timed; timing it too would count them twice
            return fn
        key = (op, backend)
        seconds, calls = self.seconds, self.calls

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[key] += time.perf_counter() - start
                calls[key] += 1

        return timed

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def report(self, wall_seconds: float | None = None) -> str:
        """A table sorted by time; ``wall_seconds`` adds an "outside kernels" row."""
        from pace_core.report import format_table

        total = sum(self.seconds.values())
        base = wall_seconds if wall_seconds else total
        rows = [
            [
                op,
                backend,
                str(self.calls[(op, backend)]),
                f"{sec * 1e3:.1f}",
                f"{100 * sec / base:.1f}",
                f"{1e6 * sec / self.calls[(op, backend)]:.1f}",
            ]
            for (op, backend), sec in sorted(self.seconds.items(), key=lambda kv: -kv[1])
        ]
        if wall_seconds:
            rest = wall_seconds - total
            rows.append(
                [
                    "(outside kernels)",
                    "-",
                    "-",
                    f"{rest * 1e3:.1f}",
                    f"{100 * rest / base:.1f}",
                    "-",
                ]
            )
        return format_table(["op", "backend", "calls", "total ms", "%", "us/call"], rows)
