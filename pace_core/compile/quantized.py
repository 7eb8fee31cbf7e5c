"""Int8 linears in a captured graph: ``F.linear(x, dequantize(codes, scales), b)`` whose
weight is de-quantized from int8 codes ``[N, K]`` with one scale per output row (or one for
all), written as ``codes.to(dtype) * scales`` or as PT2E's
``quantized_decomposed.dequantize_per_channel`` / ``dequantize_per_tensor`` with zero points
0: the catalogue's ``linear`` over an int8 :class:`~pace_core.quant.QuantizedWeight` (the
de-quantized matrix is never built)."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from pace_core.compile.patterns import LINEAR, Graph, Match, arg, fn_call, method_call, only_use
from pace_core.quant import QuantizedWeight

_CASTS = {"to", "float", "bfloat16", "half", "type"}


def _decomposed(name: str) -> tuple[Any, ...]:
    """PT2E's de-quantize op ``name`` (``torch.ops.quantized_decomposed``), if loaded."""
    ns = getattr(torch.ops, "quantized_decomposed", None)
    op = getattr(ns, name, None) if ns is not None else None
    try:
        return () if op is None else (op, op.default)
    except AttributeError:
        return ()


def _codes_scale(g: Graph, node: Any) -> tuple[fx.Node, fx.Node, list[fx.Node]] | None:
    """``(codes, scales, covered)`` of a de-quantized weight, else None."""
    if not isinstance(node, fx.Node) or not only_use(node):
        return None
    covered = [node]
    if method_call(node, "to") or method_call(node, "float") or method_call(node, "bfloat16"):
        inner = node.args[0]  # (codes * s).to(dtype)
        if fn_call(inner, operator.mul, torch.mul) and only_use(inner):
            node = inner
            covered.append(node)
    if fn_call(node, *_decomposed("dequantize_per_channel"), *_decomposed("dequantize_per_tensor")):
        codes, scales, zeros = node.args[0], node.args[1], arg(node, 2, "zero_points")
        per_channel = node.target in _decomposed("dequantize_per_channel")
        if per_channel and arg(node, 3, "axis") != 0:
            return None
        if not _zero(g, zeros) or arg(node, 6, "dtype") != torch.int8:
            return None
        return codes, scales, covered
    if not fn_call(node, operator.mul, torch.mul) or len(node.args) != 2:
        return None
    for cast, scales in (node.args, node.args[::-1]):
        cast_call = isinstance(cast, fx.Node) and cast.op == "call_method"
        if cast_call and cast.target in _CASTS and only_use(cast):
            return cast.args[0], scales, [*covered, cast]
    return None


def _unview(node: Any, covered: list[fx.Node]) -> tuple[Any, list[fx.Node]]:
    """A scales tensor behind one view of it (``s[:, None]``, ``s.unsqueeze(1)``,
    ``s.view(-1, 1)``, ``s.reshape(-1, 1)``) read only here: the tensor itself."""
    if not isinstance(node, fx.Node) or not only_use(node):
        return node, covered
    if fn_call(node, operator.getitem):
        index = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
        if all(i is None or i == slice(None) for i in index):
            return node.args[0], [*covered, node]
        return node, covered
    if method_call(node, "unsqueeze"):
        return node.args[0], [*covered, node]
    if method_call(node, "view") or method_call(node, "reshape"):
        return node.args[0], [*covered, node]
    return node, covered


def _zero(g: Graph, node: Any) -> bool:
    """Zero points absent, 0, or a tensor of zeros at compile time."""
    if node is None or node == 0:
        return True
    t = g.tensor(node)
    return t is not None and not bool(t.any())


def int8_linear(g: Graph, node: fx.Node) -> Match | None:
    """``F.linear(x, codes.to(dtype) * scales, b)`` (or a PT2E de-quantize) with int8 codes
    ``[N, K]`` and scales ``[N, 1]``, ``[N]`` (per channel, PT2E) or one value."""
    if not fn_call(node, *LINEAR):
        return None
    x, w, b = arg(node, 0, "input"), arg(node, 1, "weight"), arg(node, 2, "bias")
    found = _codes_scale(g, w)
    if found is None:
        return None
    codes_node, scales_node, covered = found
    scales_node, covered = _unview(scales_node, covered)
    codes, scales = g.tensor(codes_node), g.tensor(scales_node)
    xv, wv = Graph.meta(x), Graph.meta(w)
    bias = g.tensor(b) if b is not None else None
    if any(t is None for t in (codes, scales, xv, wv)) or (b is not None and bias is None):
        return None
    if codes.dtype != torch.int8 or codes.dim() != 2 or not scales.is_floating_point():
        return None
    n, k = codes.shape
    if scales.numel() not in (1, n) or wv.dtype != xv.dtype:
        return None
    attrs = {"in_features": int(k), "out_features": int(n), "weight_format": "int8"}
    return Match("linear", (x,), (codes_node, scales_node, b), (), (codes, scales, bias), attrs,
                 node, [node, *covered], form="int8")  # fmt: skip


def int8_weight(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> QuantizedWeight:
    """Codes ``[N, K]`` int8 and their scales (one per row or one in all) as pace's int8
    weight (per channel: ``group_size`` K; scales stored fp16, as every int8 weight)."""
    n, k = codes.shape
    s = scales.detach().float().reshape(-1, 1).expand(n, 1).to(torch.float16).contiguous()
    return QuantizedWeight("int8", (n, k), dtype, codes.detach().contiguous(), s, group_size=k)


__all__ = ["int8_linear", "int8_weight"]
