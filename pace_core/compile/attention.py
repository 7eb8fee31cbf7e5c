"""Attention-side patterns of a captured graph: transformers' rotary embedding
(``x * cos + rotate_half(x) * sin`` on the queries and keys) and
``F.scaled_dot_product_attention``, as the catalogue's ``rope`` and ``attention`` ops."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from pace_core.compile.patterns import Graph, Match, arg, fn_call, only_use

SDPA = (torch._C._nn.scaled_dot_product_attention, F.scaled_dot_product_attention)


def _rotate_half(node: Any) -> fx.Node | None:
    """The ``x`` of ``cat((-x[..., h:], x[..., :h]), dim=-1)``, else None."""
    if not (fn_call(node, torch.cat) and only_use(node)):
        return None
    parts, dim = arg(node, 0, "tensors"), arg(node, 1, "dim", 0)
    if dim != -1 or not isinstance(parts, (tuple, list)) or len(parts) != 2:
        return None
    neg, x1 = parts
    if not (fn_call(neg, operator.neg) and only_use(neg)):
        return None
    x2 = neg.args[0]
    halves = []
    for part in (x1, x2):
        if not (fn_call(part, operator.getitem) and only_use(part)):
            return None
        index = part.args[1]
        if not (isinstance(index, tuple) and len(index) == 2 and index[0] is Ellipsis):
            return None
        if not isinstance(index[1], slice) or index[1].step is not None:
            return None
        halves.append((part.args[0], index[1]))
    (src1, first), (src2, second) = halves
    x = Graph.meta(src1)
    if src1 is not src2 or x is None:
        return None
    half = x.shape[-1] // 2
    if (first.start, first.stop) != (None, half) or (second.start, second.stop) != (half, None):
        return None
    return src1


def _rope_side(g: Graph, node: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node, list] | None:
    """``(x, cos, sin, covered)`` of ``x * cos + rotate_half(x) * sin`` ending at ``node``."""
    if not fn_call(node, operator.add, torch.add) or len(node.args) != 2:
        return None
    for plain, rotated in (node.args, node.args[::-1]):
        if not (fn_call(plain, operator.mul) and fn_call(rotated, operator.mul)):
            continue
        if not (only_use(plain) and only_use(rotated)):
            continue
        for cat, sin in (rotated.args, rotated.args[::-1]):
            x = _rotate_half(cat)
            if x is None or x not in plain.args:
                continue
            cos = plain.args[1] if plain.args[0] is x else plain.args[0]
            if not _table(cos, x) or not _table(sin, x):
                continue
            parts = cat.args[0]
            covered = [node, plain, rotated, cat, parts[0], parts[1], parts[0].args[0]]
            return x, cos, sin, covered
    return None


def _table(node: Any, x: fx.Node) -> bool:
    """A cos/sin table ``[B or 1, 1, T, D]`` broadcast over ``x [B, H, T, D]``."""
    t, xv = Graph.meta(node), Graph.meta(x)
    if t is None or xv is None or t.dim() != 4 or xv.dim() != 4:
        return False
    return t.shape[1] == 1 and t.shape[-1] == xv.shape[-1] and t.dtype == xv.dtype


def rope(g: Graph, node: fx.Node) -> Match | None:
    """The queries' and keys' rotary embedding sharing one cos/sin pair (transformers'
    ``apply_rotary_pos_emb``, neox halves): one ``rope`` call for both; the match ends at
    the queries' sum and also replaces the keys'."""
    side = _rope_side(g, node)
    if side is None:
        return None
    q, cos, sin, covered = side
    for mul in cos.users:
        for other in mul.users:
            if other is node:
                continue
            found = _rope_side(g, other)
            if found is None or found[1] is not cos or found[2] is not sin or found[0] is q:
                continue
            k = found[0]
            qv, kv = Graph.meta(q), Graph.meta(k)
            if qv.shape[-1] != kv.shape[-1] or qv.dtype != kv.dtype:
                continue
            attrs = {"head_dim": int(qv.shape[-1])}
            return Match("rope", (q, k, cos, sin), (), (), (), attrs, node,
                         covered + found[3], more=(other,))  # fmt: skip
    return None


def sdpa(g: Graph, node: fx.Node) -> Match | None:
    """``F.scaled_dot_product_attention(q, k, v)`` with no dropout, a boolean ``[B|1, 1, T,
    S]`` mask or none, keys and values of one head size and ``Hq`` a multiple of ``Hk``:
    the ``attention`` op over the keys and values as a contiguous cache view."""
    if not fn_call(node, *SDPA):
        return None
    q, k, v = arg(node, 0, "query"), arg(node, 1, "key"), arg(node, 2, "value")
    mask, dropout = arg(node, 3, "attn_mask"), arg(node, 4, "dropout_p", 0.0)
    causal, scale = arg(node, 5, "is_causal", False), arg(node, 6, "scale")
    qv, kv, vv = Graph.meta(q), Graph.meta(k), Graph.meta(v)
    if qv is None or kv is None or vv is None or dropout != 0.0 or not isinstance(causal, bool):
        return None
    if any(t.dim() != 4 for t in (qv, kv, vv)) or not qv.dtype == kv.dtype == vv.dtype:
        return None
    d, hq, hk = qv.shape[-1], qv.shape[1], kv.shape[1]
    if kv.shape[-1] != d or vv.shape[-1] != d or vv.shape[1] != hk or hq % hk:
        return None
    if scale is not None and not isinstance(scale, (int, float)):
        return None
    inputs = (q, k, v)
    if mask is not None:
        mv = Graph.meta(mask)
        if causal or mv is None or mv.dtype != torch.bool or mv.dim() != 4 or mv.shape[1] != 1:
            return None
        inputs = (q, k, v, mask)
    attrs = {"head_dim": int(d), "gqa": int(hq // hk), "window": None, "sinks": False,
             "cache_layout": "contiguous"}  # fmt: skip
    scale = float(d**-0.5 if scale is None else scale)
    return Match("attention", inputs, (), (scale, causal), (), attrs, node, [node])


class KVView:
    """Keys and values ``[B, Hk, S, D]`` with their mask as a contiguous cache view (what an
    ``attention`` kernel reads: ``keys``, ``values``, ``meta.mask(window)``)."""

    __slots__ = ("_mask", "keys", "values")
    layout = "contiguous"

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> None:
        self.keys, self.values, self._mask = keys, values, mask

    @property
    def meta(self) -> KVView:
        return self

    def mask(self, window: Any) -> torch.Tensor:
        return self._mask


def sdpa_mask(t: int, s: int, causal: bool) -> torch.Tensor:
    """SDPA's own mask ``[1, 1, T, S]`` for ``is_causal`` (top-left aligned) or none."""
    full = torch.ones(t, s, dtype=torch.bool)
    return (full.tril() if causal else full).view(1, 1, t, s)


__all__ = ["SDPA", "KVView", "rope", "sdpa", "sdpa_mask"]
