"""The op-catalogue patterns found in a graph ``torch.compile`` captured (Dynamo's torch-level
FX graph): each matcher looks at one node and returns a :class:`Match` (the op, its graph
inputs, its weights and attributes, the node whose value it replaces) or None.

Weights are graph inputs whose example values are ``nn.Parameter`` (Dynamo lifts a module's
parameters to placeholders): a pattern that uses anything else as a weight is left alone.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from pace_core.quant import DENSE

LINEAR = (torch._C._nn.linear, F.linear)
# torch activation call -> the catalogue's name (``pace_core.ops.ACTIVATIONS``)
_ACTIVATIONS: dict[Any, str] = {F.silu: "silu", F.relu: "relu", torch.relu: "relu"}


@dataclass
class Match:
    """One op call found in the graph.

    ``inputs``: the graph values the kernel takes first (``x``...); ``weights``: the graph
    values of its weight tensors (parameters, or None for an absent bias), in the order its
    prepare step (or, without one, its call) takes them; ``extra``: the constants that follow
    them (an activation name, an epsilon); ``example``: the parameters behind ``weights`` at
    compile time; ``output``: the node whose uses the kernel's result replaces; ``covered``:
    every node the op stands for (removed once unused)."""

    op: str
    inputs: tuple[fx.Node, ...]
    weights: tuple[fx.Node | None, ...]
    extra: tuple[Any, ...]
    example: tuple[torch.Tensor | None, ...]
    attrs: dict[str, Any]
    output: fx.Node
    covered: list[fx.Node] = field(default_factory=list)


class Graph:
    """A captured graph with its parameters: the example value behind each placeholder."""

    def __init__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> None:
        self.gm = gm
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.values = dict(zip(placeholders, example_inputs))

    def param(self, node: Any) -> torch.Tensor | None:
        """The parameter a node is (a graph input, or an attribute of the graph module), or
        None (an activation, a buffer, a constant)."""
        if not isinstance(node, fx.Node):
            return None
        if node.op == "get_attr":
            value: Any = self.gm
            for part in str(node.target).split("."):
                value = getattr(value, part, None)
        else:
            value = self.values.get(node)
        return value if isinstance(value, torch.nn.Parameter) else None

    @staticmethod
    def meta(node: Any) -> torch.Tensor | None:
        """The fake tensor Dynamo recorded for a node's value."""
        value = node.meta.get("example_value") if isinstance(node, fx.Node) else None
        return value if isinstance(value, torch.Tensor) else None


def _fn(node: Any, *targets: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _method(node: Any, name: str) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_method" and node.target == name


def _only_use(node: fx.Node) -> bool:
    return len(node.users) == 1


def _arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


@dataclass
class LinearParts:
    x: fx.Node
    w: fx.Node
    b: fx.Node | None
    weight: torch.Tensor
    bias: torch.Tensor | None


def linear_parts(g: Graph, node: Any) -> LinearParts | None:
    """The parts of a linear call on parameters, else None."""
    if not _fn(node, *LINEAR):
        return None
    x, w, b = _arg(node, 0, "input"), _arg(node, 1, "weight"), _arg(node, 2, "bias")
    weight = g.param(w)
    if weight is None or weight.dim() != 2:
        return None
    bias = g.param(b)
    if b is not None and bias is None:
        return None
    return LinearParts(x, w, b, weight, bias)


def _activation(node: Any) -> str | None:
    if _fn(node, F.gelu):
        approximate = _arg(node, 1, "approximate", "none")
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate)
    if isinstance(node, fx.Node) and node.op == "call_function":
        return _ACTIVATIONS.get(node.target)
    return None


def gated_mlp(g: Graph, node: fx.Node) -> Match | None:
    """``down(act(gate(x)) * up(x))`` without biases: one fused ``gated_mlp`` kernel."""
    down = linear_parts(g, node)
    if down is None or down.bias is not None:
        return None
    product = down.x
    if not (_fn(product, operator.mul, torch.mul) and _only_use(product)):
        return None
    a, b = product.args[0], product.args[1]
    for act_node, up_node in ((a, b), (b, a)):
        activation = _activation(act_node)
        if activation is None or not _only_use(act_node):
            continue
        gate_node = act_node.args[0]
        gate, up = linear_parts(g, gate_node), linear_parts(g, up_node)
        if gate is None or up is None or gate.bias is not None or up.bias is not None:
            continue
        if gate.x is not up.x or not (_only_use(gate_node) and _only_use(up_node)):
            continue
        gw, uw, dw = gate.weight, up.weight, down.weight
        if gw.shape != uw.shape or dw.shape != (gw.shape[1], gw.shape[0]):
            continue
        attrs = {
            "activation": activation,
            "hidden": int(gw.shape[1]),
            "intermediate": int(gw.shape[0]),
            "weight_format": DENSE,
        }
        return Match(
            "gated_mlp", (gate.x,), (gate.w, up.w, down.w), (activation,), (gw, uw, dw),
            attrs, node, [gate_node, up_node, act_node, product, node],
        )  # fmt: skip
    return None


def linear(g: Graph, node: fx.Node) -> Match | None:
    """``x @ W.T (+ b)`` on parameters: the ``linear`` kernel over the prepared weight."""
    p = linear_parts(g, node)
    if p is None:
        return None
    attrs = {
        "in_features": int(p.weight.shape[1]),
        "out_features": int(p.weight.shape[0]),
        "weight_format": DENSE,
    }
    return Match("linear", (p.x,), (p.w, p.b), (), (p.weight, p.bias), attrs, node, [node])


def rms_norm(g: Graph, node: fx.Node) -> Match | None:
    """Hugging Face's RMSNorm, ending at ``node``: ``h = x.to(float32)``, ``h * rsqrt(
    h.pow(2).mean(-1, keepdim=True) + eps)``, scaled by the weight before or after the cast
    back (``w * h.to(dtype)``, Llama; ``(w * h).to(dtype)``, OLMo 2)."""
    end, covered = node, [node]
    if _method(node, "to"):  # OLMo 2: the cast back comes last
        node = node.args[0]
        covered.append(node)
    if not _fn(node, operator.mul, torch.mul):
        return None
    a, b = node.args[0], node.args[1]
    weight_node, normed = (a, b) if g.param(a) is not None else (b, a)
    weight = g.param(weight_node)
    if weight is None or weight.dim() != 1:
        return None
    if _method(normed, "to") and normed is not end:  # Llama: the cast back before the scale
        covered.append(normed)
        normed = normed.args[0]
    if not _fn(normed, operator.mul, torch.mul):
        return None
    h, rs = normed.args[0], normed.args[1]
    if _fn(h, torch.rsqrt):
        h, rs = rs, h
    if not _fn(rs, torch.rsqrt):
        return None
    plus = rs.args[0]
    if not _fn(plus, operator.add, torch.add) or not isinstance(plus.args[1], float):
        return None
    eps, mean = plus.args[1], plus.args[0]
    if not (_method(mean, "mean") and _arg(mean, 1, "dim") in (-1, (-1,), [-1])):
        return None
    if not mean.kwargs.get("keepdim", False) and not (len(mean.args) > 2 and mean.args[2]):
        return None
    square = mean.args[0]
    if not (_method(square, "pow") and square.args[1] == 2 and square.args[0] is h):
        return None
    if not (_method(h, "to") and torch.float32 in (*h.args[1:], h.kwargs.get("dtype"))):
        return None
    x = h.args[0]
    xv, out = g.meta(x), g.meta(end)
    if xv is None or out is None or out.dtype != xv.dtype or weight.shape[0] != xv.shape[-1]:
        return None
    inner = [normed, rs, plus, mean, square]
    if any(not _only_use(n) for n in (normed, rs, plus, mean, square)):
        return None
    if len(h.users) != 2:  # the square and the scaling
        return None
    covered += [*inner, h]
    return Match("rms_norm", (x,), (weight_node,), (float(eps),), (weight,), {}, end, covered)


def layer_norm(g: Graph, node: fx.Node) -> Match | None:
    """``F.layer_norm`` over the last dimension with parameter weight (and bias)."""
    if not _fn(node, F.layer_norm):
        return None
    x, shape = _arg(node, 0, "input"), _arg(node, 1, "normalized_shape")
    w, b = _arg(node, 2, "weight"), _arg(node, 3, "bias")
    eps = _arg(node, 4, "eps", 1e-5)
    weight, bias = g.param(w), g.param(b)
    xv = g.meta(x)
    if weight is None or (b is not None and bias is None) or xv is None:
        return None
    if tuple(shape) != (xv.shape[-1],) or not isinstance(eps, float):
        return None
    return Match("layer_norm", (x,), (w, b), (eps,), (weight, bias), {}, node, [node])


def embedding(g: Graph, node: fx.Node) -> Match | None:
    """``F.embedding(ids, W)`` with no max_norm: the ``embedding`` kernel."""
    if not _fn(node, F.embedding):
        return None
    ids, w = _arg(node, 0, "input"), _arg(node, 1, "weight")
    weight = g.param(w)
    if weight is None or _arg(node, 3, "max_norm") is not None:
        return None
    attrs = {"vocab": int(weight.shape[0]), "weight_format": DENSE}
    return Match("embedding", (ids,), (w,), (), (weight,), attrs, node, [node])


# tried in this order on every node (a gated MLP claims its three linears first)
MATCHERS: tuple[Callable[[Graph, fx.Node], Match | None], ...] = (
    gated_mlp,
    rms_norm,
    layer_norm,
    linear,
    embedding,
)
