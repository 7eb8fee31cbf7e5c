"""``torch.compile(model, backend="pace")``: the graph Dynamo captures, with the op-catalogue
patterns it contains (:mod:`pace_core.compile.patterns`) replaced by the kernels the
OperatorConfig resolver picks, per call site, with the same fallback reasons and op plan as a
pace family. Weights are prepared (packed) once, when a graph is compiled, and shared by the
graphs of later recompilations. What no pattern covers runs as the captured torch code.

The plugin contract does not change: a compiled graph calls a kernel exactly as a pace
family does (``fn(x, prepared)``, ``fn(x, weight, eps, None)``), so any kernel plugin serves
compiled graphs without knowing about them.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from pace_core.binder import KernelBinder, OpPlan
from pace_core.compile.patterns import MATCHERS, Graph, Match
from pace_core.opconfig import OperatorConfig, Resolution
from pace_core.plugins import get_host
from pace_core.registry import OpContext

log = logging.getLogger("pace.compile")

_NORMS = ("rms_norm", "layer_norm")  # fn(x, weight, ..., residual): weights passed, not prepared


class PaceBackend:
    """A ``torch.compile`` backend bound to one OperatorConfig.

    The graph's unmatched torch code runs as the captured Python (measured faster at decode
    than inductor compiling the whole graph, docs/compile.md). :attr:`plan` records every
    call site's backend across the graphs compiled so far."""

    def __init__(self, opconfig: OperatorConfig | dict | str | None = None) -> None:
        self.opconfig = OperatorConfig.coerce(opconfig)
        self.resolver = get_host().resolver(self.opconfig)
        self.plan = OpPlan()
        self.graphs = 0
        # (op, id(weight)) -> (kernel fn, prepared weight, the weight it came from, dtype)
        self._prepared: dict[tuple[str, int, torch.dtype], tuple[Callable, Any, Any]] = {}

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.graphs += 1
        replaced = self.rewrite(gm, example_inputs)
        log.info("graph %d: %d op call sites bound to plugin kernels", self.graphs, replaced)
        return gm.forward

    # -- graph surgery ---------------------------------------------------------------------
    def rewrite(self, gm: fx.GraphModule, example_inputs: list[Any]) -> int:
        """Replace every matched pattern of ``gm`` by its kernel call; how many."""
        g = Graph(gm, example_inputs)
        claimed: set[fx.Node] = set()
        matches: list[Match] = []
        for matcher in MATCHERS:
            for node in list(gm.graph.nodes):
                if node in claimed or node.op not in ("call_function", "call_method"):
                    continue
                found = matcher(g, node)
                if found is None or claimed.intersection(found.covered):
                    continue
                claimed.update(found.covered)
                matches.append(found)
        for match in matches:
            self._replace(gm, match)
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
        return len(matches)

    def _replace(self, gm: fx.GraphModule, match: Match) -> None:
        fn, prepared = self._kernel(match, self._dtype(match))
        call = _bound_call(match, fn, prepared)
        with gm.graph.inserting_before(match.output):
            value = gm.graph.call_function(call, match.inputs)
        value.meta.update(match.output.meta)
        match.output.replace_all_uses_with(value)

    def _dtype(self, match: Match) -> torch.dtype:
        x = Graph.meta(match.inputs[0])
        if match.op == "embedding" or x is None:
            return match.weights[0].dtype
        return x.dtype

    def _kernel(self, match: Match, dtype: torch.dtype) -> tuple[Callable, Any]:
        """The call site's kernel function and prepared weight (None: the op has no prepare
        step); a weight already prepared for the same op and dtype is reused."""
        key = (match.op, id(match.weights[0]), dtype)
        cached = self._prepared.get(key)
        if cached is not None and cached[2]() is match.weights[0]:
            fn, prepared, _ = cached
            self.plan.record(self._resolution(match, dtype))
            return fn, prepared
        binder = KernelBinder(dtype, self.resolver)
        binder.plan = self.plan
        if match.op in _NORMS or match.op == "embedding":
            return binder.kernel(match.op, **match.attrs).fn, None
        spec, prepared = binder.prepared(match.op, match.attrs, *match.weights)
        self._prepared[key] = (spec.fn, prepared, weakref.ref(match.weights[0]))
        return spec.fn, prepared

    def _resolution(self, match: Match, dtype: torch.dtype) -> Resolution:
        return self.resolver.resolve(OpContext(match.op, dtype, match.attrs))


def _bound_call(match: Match, fn: Callable, prepared: Any) -> Callable:
    """The graph's call of one site: the kernel with its weights bound (a plain function,
    which FX can name in the graph's code)."""
    if match.op in _NORMS:  # fn(x, weight, *rest, residual) -> (y, x): the graph reads y
        weight, rest = match.weights[0], match.weights[1:]

        def call(x: torch.Tensor) -> torch.Tensor:
            return fn(x, weight, *rest, None)[0]

    else:  # fn(x, prepared), or fn(ids, weight) for an op without a prepare step
        w = match.weights[0] if prepared is None else prepared

        def call(x: torch.Tensor) -> torch.Tensor:
            return fn(x, w)

    call.__name__ = call.__qualname__ = f"pace_{match.op}"
    return call


_default: PaceBackend | None = None


def pace_backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """The ``torch_dynamo_backends`` entry point ``pace``: ``torch.compile(m, backend="pace")``
    (the OperatorConfig from ``$PACE_OPCONFIG``, the rest of the graph eager)."""
    global _default
    if _default is None:
        _default = PaceBackend()
    return _default(gm, example_inputs)


def compile(
    model: torch.nn.Module,
    opconfig: OperatorConfig | dict | str | None = None,
    *,
    dynamic: bool | None = None,
) -> PaceBackend:
    """Compile ``model`` in place with the pace backend (``model.compile(backend=...)``: its
    ``__call__`` and everything calling it, such as transformers' ``generate``, run the
    compiled graphs); returns the backend, whose :attr:`~PaceBackend.plan` fills as graphs
    compile."""
    backend = PaceBackend(opconfig)
    model.compile(backend=backend, dynamic=dynamic)
    model.pace_backend = backend  # type: ignore[attr-defined]
    return backend


__all__ = ["PaceBackend", "compile", "pace_backend"]
