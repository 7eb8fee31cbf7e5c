"""Torch reference implementations of the pace op catalogue (see ``pace_core.ops``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from pace_core import ops
from pace_core.caches.base import Window
from pace_core.caches.kv_quant import unpack_rows
from pace_core.quant import QuantizedWeight

# The core's activation vocabulary (pace_core.ops.ACTIVATIONS), in its order, as torch functions.
ACTIVATIONS = dict(
    zip(
        ops.ACTIVATIONS,
        (F.silu, F.gelu, lambda x: F.gelu(x, approximate="tanh"), F.relu),
        strict=True,
    )
)


def embedding(ids: torch.Tensor, weight: torch.Tensor | QuantizedWeight) -> torch.Tensor:
    if isinstance(weight, QuantizedWeight):  # de-quantize the rows looked up, not the table
        return weight.dequantize(ids.reshape(-1)).view(*ids.shape, weight.shape[1])
    return F.embedding(ids, weight)


# -- matrices in any weight format ----------------------------------------------------------
TILE_BYTES = 1 << 21  # fp32 bytes of one de-quantized tile of rows (fits L2)


def matmul(x: torch.Tensor, w: torch.Tensor | QuantizedWeight) -> torch.Tensor:
    """``x @ w.T`` for a float or quantized ``w`` ``[N, K]``; a quantized one is de-quantized
    one tile of rows at a time, so no full-size float copy is ever made. A W8A8 weight
    (``activations == "int8"``) sees ``x`` rounded as its kernels do (:func:`int8_activations`)
    and, as their integer products, is summed in fp32 and rounded to ``x.dtype`` once."""
    if not isinstance(w, QuantizedWeight):
        return F.linear(x, w)
    if w.activations == "int8":
        xq = int8_activations(x.float(), w.activation_scales, w.activation_group)
        return _tiled_matmul(xq, w).to(x.dtype)
    return _tiled_matmul(x, w)


def _tiled_matmul(x: torch.Tensor, w: QuantizedWeight) -> torch.Tensor:
    """``x @ w.T`` with ``w`` de-quantized to ``x.dtype`` a tile of rows at a time."""
    n, k = w.shape
    rows = max(16, TILE_BYTES // (4 * k))
    if rows >= n:
        return F.linear(x, w.dequantize(dtype=x.dtype))
    out = x.new_empty(*x.shape[:-1], n)
    for start in range(0, n, rows):
        tile = w.dequantize(slice(start, start + rows), x.dtype)
        out[..., start : start + tile.shape[0]] = F.linear(x, tile)
    return out


def _stack_rows(weights: Sequence[torch.Tensor | QuantizedWeight]):
    """The weights as one matrix when they share a format, else the list unchanged."""
    if all(isinstance(w, torch.Tensor) for w in weights):
        return torch.cat(list(weights)).contiguous()
    try:
        return QuantizedWeight.cat(weights)  # type: ignore[arg-type]
    except (AttributeError, ValueError):
        return tuple(weights)  # mixed formats (GGUF's Q4_K_M mixes Q4_K and Q6_K)


def _matmul_parts(x: torch.Tensor, w) -> torch.Tensor:
    if isinstance(w, tuple):
        return torch.cat([matmul(x, part) for part in w], dim=-1)
    return matmul(x, w)


def _contiguous(w):
    return w.contiguous() if isinstance(w, torch.Tensor) else w


# -- linear ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class LinearWeight:
    weight: torch.Tensor | QuantizedWeight
    bias: torch.Tensor | None


def prepare_linear(weight, bias: torch.Tensor | None = None) -> LinearWeight:
    return LinearWeight(_contiguous(weight), None if bias is None else bias.contiguous())


def int8_activations(
    x: torch.Tensor, scales: torch.Tensor | None = None, group: int = 32
) -> torch.Tensor:
    """``x`` rounded as a W8A8 kernel sees it: int8 per row and group of ``group`` values (the
    weight's ``activation_group``; the whole row when K is not a multiple of it) with the
    dynamic scale ``amax / 127`` or, given ``scales [K / 32]``, those static ones (values past
    them clamp to +-127), round to nearest even, de-quantized (fp32 math, back in ``x.dtype``)."""
    k = x.shape[-1]
    group = 32 if scales is not None else group
    group = group if k % group == 0 else k
    xf = x.float().reshape(-1, k // group, group)
    if scales is None:
        amax = xf.abs().amax(-1, keepdim=True)
        inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
        scale = amax / 127.0
    else:
        scale = scales.float().view(1, -1, 1)
        inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    q = torch.round(xf * inv).clamp_(-127, 127)
    return (q * scale).reshape(x.shape).to(x.dtype)


def linear(x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
    if isinstance(w.weight, torch.Tensor):
        return F.linear(x, w.weight, w.bias)
    out = matmul(x, w.weight)
    return out if w.bias is None else out + w.bias


# -- fused QKV ------------------------------------------------------------------------------
@dataclass(frozen=True)
class QKVWeight:
    weight: Any  # one matrix, or a tuple of matrices in different formats
    bias: torch.Tensor | None
    sizes: tuple[int, int, int]


def prepare_qkv(weights: Sequence[Any], biases: Sequence[torch.Tensor] | None = None) -> QKVWeight:
    sizes = tuple(int(w.shape[0]) for w in weights)
    bias = torch.cat(list(biases)).contiguous() if biases is not None else None
    return QKVWeight(_stack_rows(weights), bias, sizes)  # type: ignore[arg-type]


def qkv_proj(x: torch.Tensor, w: QKVWeight) -> tuple[torch.Tensor, ...]:
    if isinstance(w.weight, torch.Tensor):
        return F.linear(x, w.weight, w.bias).split(w.sizes, dim=-1)
    out = _matmul_parts(x, w.weight)
    return (out if w.bias is None else out + w.bias).split(w.sizes, dim=-1)


# -- gated MLP ------------------------------------------------------------------------------
@dataclass(frozen=True)
class GatedMLPWeight:
    gate_up: Any  # [2I, H]: one matrix, or (gate, up) in different formats
    down: Any
    activation: str
    intermediate: int


def prepare_gated_mlp(gate, up, down, activation: str) -> GatedMLPWeight:
    if activation not in ops.ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; known: {', '.join(ops.ACTIVATIONS)}")
    return GatedMLPWeight(_stack_rows([gate, up]), _contiguous(down), activation,
                          int(gate.shape[0]))  # fmt: skip


def gated_mlp(x: torch.Tensor, w: GatedMLPWeight) -> torch.Tensor:
    gate, up = _matmul_parts(x, w.gate_up).split(w.intermediate, dim=-1)
    return matmul(ACTIVATIONS[w.activation](gate) * up, w.down)


# -- mixture of experts -------------------------------------------------------------------
@dataclass(frozen=True)
class MoEWeight:
    # [E, H, 2I] (gate and up interleaved along the last dim), or per expert a [2I, H] matrix
    # in any weight format (quantized experts)
    gate_up: torch.Tensor | tuple[torch.Tensor | QuantizedWeight, ...]
    gate_up_bias: torch.Tensor | None  # [E, 2I]
    down: torch.Tensor | tuple[torch.Tensor | QuantizedWeight, ...]  # [E, I, H] or E x [H, I]
    down_bias: torch.Tensor | None  # [E, H]
    alpha: float
    limit: float
    activation: str  # "swiglu_oai" (GPT-OSS: clamped, (up + 1) * gate * sigmoid(alpha gate))
    #                  or a gated_mlp activation (act(gate) * up)


def prepare_moe(
    gate_up: torch.Tensor,
    gate_up_bias: torch.Tensor | None,
    down: torch.Tensor,
    down_bias: torch.Tensor | None,
    alpha: float,
    limit: float,
    activation: str = "swiglu_oai",
) -> MoEWeight:
    if activation not in ops.MOE_ACTIVATIONS:
        known = ", ".join(ops.MOE_ACTIVATIONS)
        raise ValueError(f"moe activation {activation!r}; known: {known}")
    if isinstance(gate_up, list | tuple):  # per-expert matrices (quantized experts)
        return MoEWeight(
            tuple(gate_up), gate_up_bias, tuple(down), down_bias, alpha, limit, activation
        )
    return MoEWeight(
        gate_up.contiguous(), gate_up_bias, down.contiguous(), down_bias, alpha, limit, activation
    )


def moe(
    x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, w: MoEWeight
) -> torch.Tensor:
    """Route each token to its top-k experts; loop over the experts actually hit (quantized
    experts are de-quantized a tile at a time, as ``matmul`` does)."""
    out = torch.zeros_like(x)
    per_expert = isinstance(w.gate_up, tuple)
    for expert in experts.unique().tolist():
        token, slot = torch.where(experts == expert)
        rows = x[token]
        h = matmul(rows, w.gate_up[expert]) if per_expert else rows @ w.gate_up[expert]
        if w.gate_up_bias is not None:
            h = h + w.gate_up_bias[expert]
        gate, up = h[..., ::2], h[..., 1::2]
        if w.activation != "swiglu_oai":
            h = ACTIVATIONS[w.activation](gate) * up
        else:
            gate, up = gate.clamp(max=w.limit), up.clamp(-w.limit, w.limit)
            h = (up + 1) * (gate * torch.sigmoid(gate * w.alpha))
        h = matmul(h, w.down[expert]) if per_expert else h @ w.down[expert]
        if w.down_bias is not None:
            h = h + w.down_bias[expert]
        out.index_add_(0, token, (h * weights[token, slot, None]).to(x.dtype))
    return out


# -- norms ----------------------------------------------------------------------------------
def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm computed in fp32 (weight applied before the single cast back)."""
    if residual is not None:
        x = x + residual
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype), x


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if residual is not None:
        x = x + residual
    y = F.layer_norm(
        x.float(), x.shape[-1:], weight.float(), None if bias is None else bias.float(), eps
    )
    return y.to(x.dtype), x


# -- rotary ---------------------------------------------------------------------------------
def _rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool
) -> torch.Tensor:
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    if interleaved:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
        rotated = torch.stack((-x2, x1), dim=-1).flatten(-2)
    else:
        x1, x2 = x_rot.chunk(2, dim=-1)
        rotated = torch.cat((-x2, x1), dim=-1)
    out = x_rot * cos + rotated * sin
    return torch.cat((out, x_pass), dim=-1) if x_pass.shape[-1] else out


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply rotary embedding; cos/sin are ``[B, T, R]`` in the layout of ``interleaved``."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    return _rotate(q, cos, sin, interleaved), _rotate(k, cos, sin, interleaved)


# -- attention ------------------------------------------------------------------------------
def _sdpa(q, k, v, mask, scale, sinks):
    """Masked attention over ``[B, H, S, D]`` keys (True = attend), GQA, optional sinks."""
    if sinks is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
        )
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    combined = torch.cat([scores, sink], dim=-1)
    combined = combined - combined.amax(dim=-1, keepdim=True)
    probs = torch.softmax(combined.float(), dim=-1).to(q.dtype)[..., :-1]
    return torch.matmul(probs, v)


def _gather_blocks(pool: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    """``[B, H, length, D]`` from a block pool ``[N, H, bs, D]`` and tables ``[B, nb]``."""
    b, nb = table.shape
    _, h, bs, d = pool.shape
    return pool[table].permute(0, 2, 1, 3, 4).reshape(b, h, nb * bs, d)[:, :, :length]


def attention(
    q: torch.Tensor,
    kv,
    scale: float,
    sinks: torch.Tensor | None = None,
    window: Window = None,
) -> torch.Tensor:
    """Attention of ``q [B, Hq, T, D]`` over a cache view (contiguous, paged or slab layout).

    Masks come from the view's step metadata: causal, per-row lengths, sliding ``window``.
    """
    return _over_cache(q, kv, scale, sinks, window, None)


def latent_attention(
    q: torch.Tensor, kv, scale: float, rank: int, window: Window = None
) -> torch.Tensor:
    """MLA over a latent cache view: one KV head whose keys are the cached ``[latent | rope]``
    rows and whose values are their first ``rank`` dims (nothing else is stored).
    ``q [B, H, T, rank + rope]`` (queries already absorbed into the latent space) ->
    ``[B, H, T, rank]``."""
    return _over_cache(q, kv, scale, None, window, rank)


def _over_cache(q, kv, scale, sinks, window, latent: int | None) -> torch.Tensor:
    """Attention over any cache layout; values are the keys' first ``latent`` dims when set.
    Int8 pools (``kv_cache_dtype="int8"``) are de-quantized and attended in fp32."""
    meta = kv.meta
    mask = meta.mask(window)
    layout = getattr(kv, "layout", "contiguous")
    if layout == "contiguous":
        values = kv.values if latent is None else kv.keys[..., :latent]
        return _sdpa(q, kv.keys, values, mask, scale, sinks)
    int8 = kv.key_pool.dtype == torch.int8
    if int8:
        if latent is not None:
            raise ValueError("latent attention does not read int8 KV pools")
        out_dtype, q = q.dtype, q.float()

    def gathered(table: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = _gather_blocks(kv.key_pool, table, length)
        v = k[..., :latent] if latent is not None else _gather_blocks(kv.value_pool, table, length)
        return (unpack_rows(k), unpack_rows(v)) if int8 else (k, v)

    if layout == "paged":
        s = mask.shape[-1]
        out = _sdpa(q, *gathered(kv.block_table, s), mask, scale, sinks)
    else:  # slab: one attention call per sequence over exactly its own blocks and length
        outs = []
        for b, length in enumerate(meta.ends):
            nb = -(-length // kv.block_size)
            k, v = gathered(kv.block_table[b : b + 1, :nb], length)
            outs.append(_sdpa(q[b : b + 1], k, v, mask[b : b + 1, :, :, :length], scale, sinks))
        out = torch.cat(outs)
    return out.to(out_dtype) if int8 else out


# -- decoder stack --------------------------------------------------------------------------
def prepare_decoder_stack(layers: Sequence[Callable]) -> tuple[Callable, ...]:
    return tuple(layers)


def decoder_stack(
    x: torch.Tensor, residual: torch.Tensor | None, step: Any, layers: tuple[Callable, ...]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The blocks one after the other: ``x, residual = layer(x, residual, step)``."""
    for layer in layers:
        x, residual = layer(x, residual, step)
    return x, residual
