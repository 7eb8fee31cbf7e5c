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
import operator
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from pace_core.binder import KernelBinder, OpPlan
from pace_core.compile.attention import KVView, rope, sdpa, sdpa_mask
from pace_core.compile.patterns import (
    Graph,
    Match,
    embedding,
    gated_mlp,
    layer_norm,
    linear,
    linear_parts,
    residual_layer_norm,
    residual_rms_norm,
    rms_norm,
)
from pace_core.compile.quantized import int8_linear, int8_weight
from pace_core.errors import ConfigError
from pace_core.opconfig import OperatorConfig, OpResolver
from pace_core.plugins import get_host

log = logging.getLogger("pace.compile")

# opaque ops Dynamo records (custom ops with a fake implementation) -> the Python function the
# compiled graph calls in their place (no dispatcher on the hot path)
_DIRECT_CALLS: dict[Any, Callable[..., Any]] = {}


def direct_call(op: Any, fn: Callable[..., Any]) -> None:
    """Have compiled graphs call ``fn`` where Dynamo recorded the custom op ``op``."""
    _DIRECT_CALLS[op] = fn


# tried in this order on every node (a gated MLP claims its three linears first, a norm of a
# sum claims the add before the plain norm would)
MATCHERS: tuple[Callable[[Graph, fx.Node], Match | None], ...] = (
    gated_mlp,
    residual_rms_norm,
    rms_norm,
    residual_layer_norm,
    layer_norm,
    int8_linear,
    linear,
    embedding,
    rope,
    sdpa,
)

_NORMS = ("rms_norm", "layer_norm")  # fn(x, weight, ..., residual): weights passed, not prepared


class PaceBackend:
    """A ``torch.compile`` backend bound to one OperatorConfig.

    The graph's unmatched torch code runs as the captured Python (measured faster at decode
    than inductor compiling the whole graph, docs/compile.md). :attr:`plan` records every
    call site's backend across the graphs compiled so far.

    A call site reads its weights from the graph's inputs at every call and finds their
    prepared form by the parameters' identity: Dynamo reuses one graph for every layer of a
    model whose layer code it compiled once (``inline_inbuilt_nn_modules``), each call with
    that layer's parameters, so a graph holds no weights of its own. The first call of a
    parameter prepares it (the compile-time parameters are prepared while compiling)."""

    def __init__(
        self,
        opconfig: OperatorConfig | dict | str | None = None,
        *,
        resolver: OpResolver | None = None,
    ) -> None:
        """``resolver``: resolve with this one (a model's, whose plan it shares) instead of a
        new one for ``opconfig``."""
        if resolver is not None and opconfig is not None:
            raise ConfigError("give PaceBackend an opconfig or a resolver, not both")
        self.resolver = resolver or get_host().resolver(OperatorConfig.coerce(opconfig))
        self.opconfig = self.resolver.config
        self.plan = OpPlan()
        self.graphs = 0
        self.left_to_torch = 0  # linears on parameters no pattern took, over all graphs
        self.matched: Counter[str] = Counter()  # pattern (matcher) name -> sites, all graphs
        self.prepared = PreparedWeights()

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.graphs += 1
        replaced = self.rewrite(gm, example_inputs)
        log.info("graph %d: %d op call sites bound to plugin kernels", self.graphs, replaced)
        return gm.forward

    def rewrite(self, gm: fx.GraphModule, example_inputs: list[Any]) -> int:
        """Replace every matched pattern of ``gm`` by its kernel call; how many."""
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target in _DIRECT_CALLS:
                node.target = _DIRECT_CALLS[node.target]
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
                found.pattern = matcher.__name__
        placed = _placed(gm, matches)
        # a match's inputs may be another match's outputs (a post-norm reads the MLP's
        # result): they are read through what replaced them
        replaced: dict[fx.Node, fx.Node] = {}
        for match, at in placed:
            self.matched[match.pattern] += 1
            call = self._site(match)
            inputs = tuple(replaced.get(x, x) for x in match.inputs)
            with gm.graph.inserting_before(at):
                value = gm.graph.call_function(call, (*inputs, *match.weights))
                results = [value]
                if match.more:
                    results = [gm.graph.call_function(operator.getitem, (value, i))
                               for i in range(len(match.outputs))]  # fmt: skip
            outside = _outside(match)  # the covered nodes keep reading the originals
            for out, result in zip(match.outputs, results, strict=True):
                result.meta.update(out.meta)
                out.replace_all_uses_with(result, delete_user_cb=outside)
                replaced[out] = result
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
        left = sum(1 for n in gm.graph.nodes if linear_parts(g, n) is not None)
        if left:
            log.info("graph %d: %d linears on parameters left to torch", self.graphs, left)
        self.left_to_torch += left
        return len(placed)

    def _site(self, match: Match) -> Callable[..., Any]:
        """The graph's call of one site (a plain function FX can name in the graph's code):
        ``call(*inputs, *weights)`` with the kernel resolved now."""
        x = Graph.meta(match.inputs[0])
        dtype = match.example[0].dtype if match.op == "embedding" or x is None else x.dtype
        binder = KernelBinder(dtype, self.resolver)
        binder.plan = self.plan
        op, extra, cache = match.op, match.extra, self.prepared
        if op in _NORMS:  # fn(x, weight, [bias,] eps, residual) -> (y, x + residual)
            fn = binder.kernel(op, **match.attrs).fn
            cache.put(op, match.example, _fp32(match.example))
            if match.form == "residual":

                def call(x: Any, residual: Any, *weights: Any) -> Any:
                    return fn(x, *cache.get(op, weights, _fp32), *extra, residual)

            else:

                def call(x: Any, *weights: Any) -> Any:
                    return fn(x, *cache.get(op, weights, _fp32), *extra, None)[0]

        elif op == "embedding":  # fn(ids, weight)
            fn = binder.kernel(op, **match.attrs).fn

            def call(x: Any, *weights: Any) -> Any:
                return fn(x, *weights)

        elif op == "rope":  # fn(q [B,T,H,D], k, cos [B,T,D], sin, interleaved), in place
            call = _rope_call(binder.kernel(op, **match.attrs).fn)
        elif op == "attention":  # fn(q, kv view, scale, sinks, window)
            call = _attention_call(binder.kernel(op, **match.attrs).fn, *extra)
        else:  # fn(x, prepared); prepare(*weights, *extra)
            weights_of = _int8_parts(dtype) if match.form == "int8" else _as_is
            spec, first = binder.prepared(op, match.attrs, *weights_of(match.example), *extra)
            fn, prepare = spec.fn, spec.prepare
            cache.put(op, match.example, first)

            def make(ws: tuple[Any, ...]) -> Any:
                return prepare(*weights_of(ws), *extra)

            def call(x: Any, *weights: Any) -> Any:
                return fn(x, cache.get(op, weights, make))

        call.__name__ = call.__qualname__ = f"pace_{op}"
        return call


def _placed(gm: fx.GraphModule, matches: list[Match]) -> list[tuple[Match, fx.Node]]:
    """Each match with the node its call goes before (the first use of any of its outputs
    outside it), in that order; a match whose inputs are not all computed by then is left to
    torch (its nodes stay)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    producer = {out: m for m in matches for out in m.outputs}
    spots = {}
    for m in matches:
        covered = set(m.covered)
        users = [u for out in m.outputs for u in out.users if u not in covered]
        spots[id(m)] = min(users, key=order.__getitem__) if users else m.output
    ranked = sorted(matches, key=lambda m: (order[spots[id(m)]], order[m.output]))
    placed: list[tuple[Match, fx.Node]] = []
    done: set[int] = set()
    for m in ranked:
        at = spots[id(m)]
        ok = True
        for x in m.inputs:
            p = producer.get(x)
            if p is not None and id(p) in done:
                continue
            ok = ok and p is None and order[x] < order[at]
        if ok:
            placed.append((m, at))
            done.add(id(m))
        else:
            log.info("%s at %s: its inputs come after its first use; left to torch", m.op, at)
    return placed


def _outside(match: Match) -> Callable[[fx.Node], bool]:
    covered = set(match.covered)
    return lambda node: node not in covered


def _as_is(weights: tuple[Any, ...]) -> tuple[Any, ...]:
    return weights


def _int8_parts(dtype: torch.dtype) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """(codes, scales, bias) -> (int8 QuantizedWeight, bias): an int8 linear's prepare
    arguments."""

    def parts(weights: tuple[Any, ...]) -> tuple[Any, ...]:
        codes, scales, bias = weights
        return int8_weight(codes, scales, dtype), bias

    return parts


def _rope_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``call(q, k, cos, sin)`` over transformers' layout (``q [B, H, T, D]``, tables ``[B|1,
    1, T, D]``) -> ``(q, k)`` rotated; the kernel rotates copies (it works in place)."""

    def call(q: Any, k: Any, cos: Any, sin: Any) -> Any:
        b = q.shape[0]
        c, s = cos.select(1, 0), sin.select(1, 0)
        if c.shape[0] != b:
            c, s = c.expand(b, -1, -1), s.expand(b, -1, -1)
        qt = q.transpose(1, 2).contiguous(memory_format=torch.contiguous_format)
        kt = k.transpose(1, 2).contiguous(memory_format=torch.contiguous_format)
        if qt.data_ptr() == q.data_ptr():  # already [B, T, H, D] in memory: the graph's own
            qt = qt.clone()
        if kt.data_ptr() == k.data_ptr():
            kt = kt.clone()
        qr, kr = fn(qt, kt, c.contiguous(), s.contiguous(), False)
        return qr.transpose(1, 2), kr.transpose(1, 2)

    return call


def _attention_call(fn: Callable[..., Any], scale: float, causal: bool) -> Callable[..., Any]:
    """``call(q, k, v[, mask])`` as ``F.scaled_dot_product_attention`` with this ``scale``
    and ``is_causal``, through an ``attention`` kernel over a contiguous view."""

    def call(q: Any, k: Any, v: Any, mask: Any = None) -> Any:
        if mask is None:
            mask = sdpa_mask(q.shape[2], k.shape[2], causal)
        return fn(q, KVView(k, v, mask), scale, None, None)

    return call


def _fp32(weights: tuple[torch.Tensor | None, ...]) -> tuple[torch.Tensor | None, ...]:
    return tuple(None if w is None else w.detach().float() for w in weights)


class PreparedWeights:
    """Prepared weights by (op, the identity of the first weight tensor). An entry leaves
    when its tensor is freed (a backend outliving a model does not keep its packed weights),
    so a new tensor at the same address never finds it."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, int], tuple[weakref.ref, Any]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, op: str, weights: tuple[Any, ...], prepared: Any) -> None:
        key = (op, id(weights[0]))
        entries = self._entries

        def forget(ref: weakref.ref) -> None:
            if entries.get(key, (None,))[0] is ref:
                del entries[key]

        entries[key] = (weakref.ref(weights[0], forget), prepared)

    def get(self, op: str, weights: tuple[Any, ...], make: Callable[[tuple], Any]) -> Any:
        found = self._entries.get((op, id(weights[0])))
        if found is not None and found[0]() is weights[0]:
            return found[1]
        prepared = make(weights)
        self.put(op, weights, prepared)
        return prepared


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


__all__ = ["PaceBackend", "compile", "direct_call", "pace_backend"]
