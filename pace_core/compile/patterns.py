"""The op-catalogue patterns found in a graph ``torch.compile`` captured (Dynamo's torch-level
FX graph): each matcher looks at one node and returns a :class:`Match` (the op, its graph
inputs, its weights and attributes, the node whose value it replaces) or None.

Weights are graph inputs whose example values are ``nn.Parameter`` (Dynamo lifts a module's
parameters to placeholders): a pattern that uses anything else as a weight is left alone.
"""

from __future__ import annotations

import operator
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
    every node the op stands for (removed once unused); ``more``: further nodes replaced by
    further results (the call then returns ``(output, *more)``); ``form``: which call of the
    op (``"residual"``: a norm with its residual add, ``"int8"``: a linear over int8 codes
    and scales), "" for the plain one."""

    op: str
    inputs: tuple[fx.Node, ...]
    weights: tuple[fx.Node | None, ...]
    extra: tuple[Any, ...]
    example: tuple[torch.Tensor | None, ...]
    attrs: dict[str, Any]
    output: fx.Node
    covered: list[fx.Node] = field(default_factory=list)
    more: tuple[fx.Node, ...] = ()
    form: str = ""
    pattern: str = ""  # the matcher that found it (PaceBackend.matched counts them)

    @property
    def outputs(self) -> tuple[fx.Node, ...]:
        return (self.output, *self.more)


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

    def tensor(self, node: Any) -> torch.Tensor | None:
        """The tensor a graph input or module attribute is (a parameter or a buffer), else
        None."""
        if isinstance(node, fx.Node) and node.op == "get_attr":
            value: Any = self.gm
            for part in str(node.target).split("."):
                value = getattr(value, part, None)
            return value if isinstance(value, torch.Tensor) else None
        value = self.values.get(node) if isinstance(node, fx.Node) else None
        return value if isinstance(value, torch.Tensor) else None

    @staticmethod
    def meta(node: Any) -> torch.Tensor | None:
        """The fake tensor Dynamo recorded for a node's value."""
        value = node.meta.get("example_value") if isinstance(node, fx.Node) else None
        return value if isinstance(value, torch.Tensor) else None


def fn_call(node: Any, *targets: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def method_call(node: Any, name: str) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_method" and node.target == name


def only_use(node: fx.Node) -> bool:
    return len(node.users) == 1


def arg(node: fx.Node, i: int, name: str, default: Any = None) -> Any:
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
    if not fn_call(node, *LINEAR):
        return None
    x, w, b = arg(node, 0, "input"), arg(node, 1, "weight"), arg(node, 2, "bias")
    weight = g.param(w)
    if weight is None or weight.dim() != 2:
        return None
    bias = g.param(b)
    if b is not None and bias is None:
        return None
    return LinearParts(x, w, b, weight, bias)


def _activation(node: Any) -> str | None:
    if fn_call(node, F.gelu):
        approximate = arg(node, 1, "approximate", "none")
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
    if not (fn_call(product, operator.mul, torch.mul) and only_use(product)):
        return None
    a, b = product.args[0], product.args[1]
    for act_node, up_node in ((a, b), (b, a)):
        activation = _activation(act_node)
        if activation is None or not only_use(act_node):
            continue
        gate_node = act_node.args[0]
        gate, up = linear_parts(g, gate_node), linear_parts(g, up_node)
        if gate is None or up is None or gate.bias is not None or up.bias is not None:
            continue
        if gate.x is not up.x or not (only_use(gate_node) and only_use(up_node)):
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
    if method_call(node, "to"):  # OLMo 2: the cast back comes last
        node = node.args[0]
        covered.append(node)
    if not fn_call(node, operator.mul, torch.mul):
        return None
    a, b = node.args[0], node.args[1]
    weight_node, normed = (a, b) if g.param(a) is not None else (b, a)
    weight = g.param(weight_node)
    if weight is None or weight.dim() != 1:
        return None
    if method_call(normed, "to") and normed is not end:  # Llama: the cast back before the scale
        covered.append(normed)
        normed = normed.args[0]
    if not fn_call(normed, operator.mul, torch.mul):
        return None
    h, rs = normed.args[0], normed.args[1]
    if fn_call(h, torch.rsqrt):
        h, rs = rs, h
    if not fn_call(rs, torch.rsqrt):
        return None
    plus = rs.args[0]
    if not fn_call(plus, operator.add, torch.add) or not isinstance(plus.args[1], float):
        return None
    eps, mean = plus.args[1], plus.args[0]
    if not (method_call(mean, "mean") and arg(mean, 1, "dim") in (-1, (-1,), [-1])):
        return None
    if not mean.kwargs.get("keepdim", False) and not (len(mean.args) > 2 and mean.args[2]):
        return None
    square = mean.args[0]
    if not (method_call(square, "pow") and square.args[1] == 2 and square.args[0] is h):
        return None
    if not (method_call(h, "to") and torch.float32 in (*h.args[1:], h.kwargs.get("dtype"))):
        return None
    x = h.args[0]
    xv, out = g.meta(x), g.meta(end)
    if xv is None or out is None or out.dtype != xv.dtype or weight.shape[0] != xv.shape[-1]:
        return None
    inner = [normed, rs, plus, mean, square]
    if any(not only_use(n) for n in (normed, rs, plus, mean, square)):
        return None
    if len(h.users) != 2:  # the square and the scaling
        return None
    covered += [*inner, h]
    return Match("rms_norm", (x,), (weight_node,), (float(eps),), (weight,), {}, end, covered)


def layer_norm(g: Graph, node: fx.Node) -> Match | None:
    """``F.layer_norm`` over the last dimension with parameter weight (and bias)."""
    if not fn_call(node, F.layer_norm):
        return None
    x, shape = arg(node, 0, "input"), arg(node, 1, "normalized_shape")
    w, b = arg(node, 2, "weight"), arg(node, 3, "bias")
    eps = arg(node, 4, "eps", 1e-5)
    weight, bias = g.param(w), g.param(b)
    xv = g.meta(x)
    if weight is None or (b is not None and bias is None) or xv is None:
        return None
    if tuple(shape) != (xv.shape[-1],) or not isinstance(eps, float):
        return None
    return Match("layer_norm", (x,), (w, b), (eps,), (weight, bias), {}, node, [node])


def embedding(g: Graph, node: fx.Node) -> Match | None:
    """``F.embedding(ids, W)`` with no max_norm: the ``embedding`` kernel."""
    if not fn_call(node, F.embedding):
        return None
    ids, w = arg(node, 0, "input"), arg(node, 1, "weight")
    weight = g.param(w)
    if weight is None or arg(node, 3, "max_norm") is not None:
        return None
    attrs = {"vocab": int(weight.shape[0]), "weight_format": DENSE}
    return Match("embedding", (ids,), (w,), (), (weight,), attrs, node, [node])


def _with_residual(g: Graph, m: Match | None) -> Match | None:
    """A norm match of a sum ``a + b`` (the residual add before a pre-norm) as the norm's call
    with its fused residual add, which returns the norm and the sum (the sum's other uses,
    such as the next residual add, read the second result)."""
    if m is None or not fn_call(total := m.inputs[0], operator.add, torch.add):
        return None
    if len(total.args) != 2 or total.kwargs:
        return None
    a, b = total.args
    av, bv, tv = g.meta(a), g.meta(b), g.meta(total)
    if av is None or bv is None or tv is None:
        return None
    if av.dtype != tv.dtype or bv.dtype != tv.dtype or av.dim() != tv.dim() or bv.dim() != tv.dim():
        return None
    if av.shape[-1] != tv.shape[-1] or bv.shape[-1] != tv.shape[-1]:
        return None
    m.inputs, m.more, m.form = (a, b), (total,), "residual"
    m.covered.append(total)
    return m


def residual_rms_norm(g: Graph, node: fx.Node) -> Match | None:
    """:func:`rms_norm` of ``a + b``: one ``rms_norm`` call with its residual."""
    return _with_residual(g, rms_norm(g, node))


def residual_layer_norm(g: Graph, node: fx.Node) -> Match | None:
    """:func:`layer_norm` of ``a + b``: one ``layer_norm`` call with its residual."""
    return _with_residual(g, layer_norm(g, node))
