"""The ``fn`` half of each kernel: thin calls into the C++ extension (``csrc/bindings.cpp``).

Signatures follow ``pace_core.ops``; results match ``pace_native.kernels`` (fp32 accumulation,
one rounding to the activation dtype at the end).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from pace_avx512 import build
from pace_avx512.packing import PackedExperts, PackedGatedMLP, PackedLinear, PackedQKV
from pace_avx512.qpacking import QPackedGatedMLP, QPackedLinear, QPackedQKV
from pace_core.caches.base import Window

_E: ModuleType | None = None  # the loaded extension: `(_E or _ext())` costs one global lookup


def _ext() -> ModuleType:
    global _E
    _E = build.load_extension()
    return _E


def linear(x: torch.Tensor, w: PackedLinear | QPackedLinear) -> torch.Tensor:
    if w.__class__ is QPackedLinear:  # quantized weights: the VNNI kernel
        return (_E or _ext()).qlinear(
            x, w.weight, w.bias, w.out_features, w.kind, w.int8_activations, w.w8a8, w.act_scales
        )
    return (_E or _ext()).linear(x, w.weight, w.bias, w.out_features)


def qkv_proj(x: torch.Tensor, w: PackedQKV | QPackedQKV) -> tuple[torch.Tensor, ...]:
    if w.linear.__class__ is tuple:  # quantized parts in different formats
        return tuple(linear(x, part) for part in w.linear)  # type: ignore[union-attr]
    return linear(x, w.linear).split_with_sizes(w.sizes, -1)  # type: ignore[arg-type]


def gated_mlp(x: torch.Tensor, w: PackedGatedMLP | QPackedGatedMLP) -> torch.Tensor:
    if w.__class__ is QPackedGatedMLP:
        if w.gate_up.__class__ is tuple:  # gate and up in different formats
            gate, up = (linear(x, part) for part in w.gate_up)
        else:
            gate, up = linear(x, w.gate_up).split_with_sizes((w.intermediate,) * 2, -1)
        return linear((_E or _ext()).gated_activation(gate, up, w.activation), w.down)
    return (_E or _ext()).gated_mlp(x, w.gate_up, w.down, w.intermediate, w.hidden, w.activation)


def _expert(x: torch.Tensor, w: PackedExperts, e: int) -> torch.Tensor:
    if not w.clamped:
        return gated_mlp(x, w.experts[e])
    expert = w.experts[e]  # GPT-OSS: clamped SwiGLU between two packed linears
    h = linear(x, expert.gate_up)
    gate, up = h[..., ::2].clamp(max=w.limit), h[..., 1::2].clamp(-w.limit, w.limit)
    return linear((up + 1) * (gate * torch.sigmoid(gate * w.alpha)), expert.down)


def moe(x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, w: PackedExperts):
    """Each hit expert's packed MLP over the rows routed to it (one call per expert: a decode
    row calls its k experts directly), weighted and summed into the output."""
    if x.shape[0] == 1:
        out = None
        for expert, weight in zip(experts[0].tolist(), weights[0].tolist()):
            h = _expert(x, w, expert) * weight
            out = h if out is None else out + h
        return out
    out = torch.zeros_like(x)
    for expert in experts.unique().tolist():
        token, slot = torch.where(experts == expert)
        h = _expert(x[token], w, expert)
        out.index_add_(0, token, (h * weights[token, slot, None]).to(x.dtype))
    return out


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    return (_E or _ext()).rms_norm(x, weight, eps, residual)


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    return (_E or _ext()).layer_norm(x, weight, bias, eps, residual)


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: ``q`` and ``k`` are rotated and returned (no copies of the heads)."""
    return (_E or _ext()).rope(q, k, cos, sin, interleaved)


def attention(
    q: torch.Tensor, kv: Any, scale: float, sinks: torch.Tensor | None = None,
    window: Window = None,
) -> torch.Tensor:  # fmt: skip
    """Attention over a cache view: contiguous, or paged/slab pools read through the table."""
    mask = kv.meta.mask(window)
    if getattr(kv, "layout", "contiguous") == "contiguous":
        return (_E or _ext()).attention(q, kv.keys, kv.values, mask, scale, sinks)
    return (_E or _ext()).attention(
        q, kv.key_pool, kv.value_pool, mask, scale, sinks, kv.block_table, kv.block_size
    )


def latent_attention(
    q: torch.Tensor, kv: Any, scale: float, rank: int, window: Window = None
) -> torch.Tensor:
    """MLA over a latent cache: the flash attention kernel with the cached ``[latent | k_pe]``
    rows as both keys and values (one KV head: every query head of a tile shares each block
    while it is in L1); the output's first ``rank`` dims are the latent-space result."""
    mask = kv.meta.mask(window)
    if getattr(kv, "layout", "contiguous") == "contiguous":
        out = (_E or _ext()).attention(q, kv.keys, kv.keys, mask, scale, None)
    else:
        out = (_E or _ext()).attention(
            q, kv.key_pool, kv.key_pool, mask, scale, None, kv.block_table, kv.block_size
        )
    return out[..., :rank]
