"""The fused ``decoder_stack``: a model's blocks described once for the C++ loop (stack.cpp).

``prepare`` reads the built blocks (pre-norm and sandwich blocks whose ops are all avx512
kernels) into plain tuples of packed weights and sizes. Each forward step over a cache that
exposes its buffers (``direct_buffers``: the contiguous caches) runs all blocks in one C++
call, ragged (left-padded) rows included; steps over other caches run the same blocks in
Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pace_avx512 import build, kernels
from pace_avx512.packing import PackedGatedMLP, PackedLinear, PackedQKV
from pace_core.models.layers import Attention, Bound, Norm, PreNormBlock, SandwichBlock

FUSABLE_BLOCKS = frozenset({"PreNormBlock", "SandwichBlock"})


class NotFusable(ValueError):
    """A block the C++ loop does not cover (the resolver then uses the Python loop)."""


@dataclass(frozen=True)
class FusedStack:
    layers: tuple[Callable, ...]  # the blocks, for steps the C++ loop does not take
    cpp: Any  # the extension's DecoderStack
    rotaries: tuple[Any, ...]  # the step's rope tables are looked up by these, in order
    windows: tuple[int | None, ...]  # the step's masks, in order


def _norm(norm: Norm | None) -> tuple | None:
    if norm is None:
        return None
    if norm.fn not in (kernels.rms_norm, kernels.layer_norm):
        raise NotFusable(f"norm kernel {norm.fn!r} is not pace-avx512's")
    return (norm.weight, norm.bias, float(norm.eps), norm.is_rms)


def _linear(bound: Bound) -> tuple:
    w = bound.weight
    if bound.fn is not kernels.linear or not isinstance(w, PackedLinear):
        raise NotFusable("a projection is not on pace-avx512's linear")
    return (w.weight, w.bias, w.out_features)


def _slot(table: dict, key: Any, value: Any) -> int:
    """Position of ``key`` in ``table`` (insertion order), added with ``value`` if new."""
    table.setdefault(key, value)
    return list(table).index(key)


def _attention(attn: Attention, rotaries: dict[int, Any], windows: dict) -> dict[str, Any]:
    qkv = attn.qkv.weight
    if attn.qkv.fn is not kernels.qkv_proj or not isinstance(qkv, PackedQKV):
        raise NotFusable("the QKV projection is not on pace-avx512's qkv_proj")
    if attn.attend is not kernels.attention:
        raise NotFusable("attention is not pace-avx512's")
    rope = -1
    if attn.rope_fn is not None:
        if attn.rope_fn is not kernels.rope:
            raise NotFusable("rope is not pace-avx512's")
        rope = _slot(rotaries, id(attn.rotary), attn.rotary)
    lin = qkv.linear
    return {
        "qkv": (lin.weight, lin.bias, lin.out_features),
        "sizes": tuple(qkv.sizes),
        "q_norm": _norm(attn.q_norm),
        "k_norm": _norm(attn.k_norm),
        "o": _linear(attn.o_proj),
        "heads": (attn.layer, attn.num_heads, attn.num_kv_heads, attn.head_dim),
        "scale": float(attn.scale),
        "rope": rope,
        "interleaved": bool(attn.rotary.interleaved) if attn.rotary is not None else False,
        "mask": _slot(windows, attn.window, attn.window),
        "sinks": None if attn.sinks is None else attn.sinks.float().contiguous(),
    }


def _mlp(mlp: Any) -> tuple:
    if not (isinstance(mlp, Bound) and mlp.fn is kernels.gated_mlp):
        raise NotFusable(f"MLP {type(mlp).__name__} is not pace-avx512's gated_mlp")
    w: PackedGatedMLP = mlp.weight
    return (w.gate_up, w.down, w.intermediate, w.hidden, w.activation)


def describe(block: Any, rotaries: dict[int, Any], windows: dict) -> dict[str, Any]:
    """One block as the dict ``stack.cpp`` reads (raises NotFusable)."""
    if isinstance(block, PreNormBlock):
        norms = [block.norm1, block.norm2]
        spec = {"sandwich": False, **_attention(block.attn, rotaries, windows)}
    elif isinstance(block, SandwichBlock):
        norms = [block.pre_attn, block.post_attn, block.pre_mlp, block.post_mlp]
        spec = {"sandwich": True, **_attention(block.attn, rotaries, windows)}
    else:
        raise NotFusable(f"{type(block).__name__} blocks are not fused")
    spec["norms"] = [_norm(n) for n in norms]
    spec["mlp"] = _mlp(block.mlp)
    return spec


def prepare(layers: Sequence[Callable]) -> FusedStack:
    rotaries: dict[int, Any] = {}  # id -> Rotary, in the order the layers index them
    windows: dict[int | None, int | None] = {}
    specs = [describe(block, rotaries, windows) for block in layers]
    return FusedStack(
        layers=tuple(layers),
        cpp=build.load_extension().DecoderStack(specs),
        rotaries=tuple(rotaries.values()),
        windows=tuple(windows),
    )


def decoder_stack(
    x: torch.Tensor, residual: torch.Tensor | None, step: Any, w: FusedStack
) -> tuple[torch.Tensor, torch.Tensor | None]:
    meta = step.meta
    buffers = getattr(step.cache, "direct_buffers", None)
    if meta is None or buffers is None:
        for layer in w.layers:
            x, residual = layer(x, residual, step)
        return x, residual
    keys, values = buffers()
    ropes = [step.rope[id(r)] for r in w.rotaries]
    masks = [meta.mask(window) for window in w.windows]
    starts, counts = meta.lens_before.tolist(), meta.num_new.tolist()
    return w.cpp.run(x, residual, keys, values, starts, counts, meta.max_len, masks, ropes)
