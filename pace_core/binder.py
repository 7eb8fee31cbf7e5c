"""Resolve ops and bind their kernels once, recording the plan: what a model build and a
compiled graph share (:class:`~pace_core.models.builder.ModelBuilder` for pace's families,
:mod:`pace_core.compile` for graphs captured by ``torch.compile``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import torch

from pace_core.errors import OpResolutionError
from pace_core.opconfig import OpResolver, Resolution
from pace_core.ops import OPS
from pace_core.profiling import OpProfiler
from pace_core.registry import KernelSpec, OpContext


class OpPlan:
    """The resolved backend of every op call site of a model, printable as a table."""

    def __init__(self) -> None:
        self.sites: Counter[tuple[str, str, str]] = Counter()  # (op, backend, why not better)
        self.resolutions: list[Resolution] = []
        self.named: dict[str, Resolution] = {}  # a named call site's resolution (DLRM's)

    def record(self, res: Resolution, site: str | None = None) -> None:
        self.sites[(res.op, res.backend, res.note)] += 1
        self.resolutions.append(res)
        if site is not None:
            self.named[site] = res

    def backends(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for op, backend, _ in self.sites:
            out.setdefault(op, set()).add(backend)
        return out

    def __str__(self) -> str:
        from pace_core.report import format_table

        rows = [
            [op, backend, str(n), reason or "-"] for (op, backend, reason), n in self.sites.items()
        ]
        return format_table(["op", "backend", "sites", "fallback reason"], rows)


class KernelBinder:
    """Resolves each op call site once under one resolver and dtype, runs the kernel's prepare
    step, and records every resolution in :attr:`plan`."""

    def __init__(self, dtype: torch.dtype, resolver: OpResolver) -> None:
        self.dtype, self.resolver = dtype, resolver
        self.plan = OpPlan()
        self.profiler: OpProfiler | None = None
        # the KV cache storage dtype (``kv_cache_dtype``), given to every op reading the
        # cache; None: the model dtype (``auto``)
        self.kv_dtype: str | None = None

    def context(self, op: str, attrs: dict[str, Any]) -> OpContext:
        """The resolver's view of a call site: ``attrs`` and, for ops that read the KV cache,
        its storage dtype."""
        if self.kv_dtype is not None and "kv_dtype" in OPS[op].context:
            attrs = {**attrs, "kv_dtype": self.kv_dtype}
        return OpContext(op, self.dtype, attrs)

    def kernel(self, op: str, **attrs: Any) -> KernelSpec:
        return self._use(self.resolver.resolve(self.context(op, attrs)))

    def _use(self, res: Resolution, site: str | None = None) -> KernelSpec:
        """Record a resolution in the plan; its kernel (timed when profiling)."""
        self.plan.record(res, site)
        if self.profiler is None:
            return res.kernel
        return replace(res.kernel, fn=self.profiler.wrap(res.op, res.backend, res.kernel.fn))

    def prepared(
        self, op: str, attrs: dict[str, Any], *weights: Any, site: str | None = None
    ) -> tuple[KernelSpec, Any]:
        """Resolve ``op``, run its prepare step on ``weights``: the kernel and its weight
        (recorded under ``site`` when named).

        A backend whose prepare step fails (say, its JIT build breaks) is disabled with the
        error as the reason and the next candidate is used; native failures propagate.
        """
        while True:  # only the kernel that prepared enters the plan
            res = self.resolver.resolve(self.context(op, attrs))
            k = res.kernel
            try:
                prepared = k.prepare(*weights)
            except Exception as exc:
                if k.backend == "native":
                    raise
                if self.resolver.config.strict:
                    raise OpResolutionError(
                        f"op {op!r}: backend {k.backend!r} failed to prepare its weights "
                        f"({type(exc).__name__}: {exc}); strict=True allows no fallback"
                    ) from exc
                self.resolver.disable(k, f"prepare failed: {type(exc).__name__}: {exc}")
                continue
            return self._use(res, site), prepared
