"""The KV cache storage dtypes (``kv_cache_dtype``) and the int8 KV format.

``"auto"`` stores keys and values in the model's dtype. ``"int8"`` stores each (token, KV
head) row of ``D`` values as ``D + 4 * ceil(D / 32)`` bytes: the ``D`` int8 values, then one
fp32 scale (native byte order) per group of 32 values (the last group may be shorter). An
int8 pool is thus an int8 tensor ``[blocks, H, block_size, row bytes]`` that block copies, the
disk tier and copy-on-write move like any other. Symmetric, per group: ``scale = amax / 127``,
``q = round(x / scale)`` (to nearest even, clamped to ±127; a zero group is zeros with scale
0), read back as ``q * scale`` in fp32.

Why groups of 32 within a (token, head) row: a row is quantized once, when it is written, and
never rewritten, so incremental writes (decode, prefill chunks) need no re-scaling of older
tokens (per-block or per-channel scales would); and keys carry outlier channels (RoPE'd
Llama dims, Gemma's QK-norm weights) that one scale per row spreads over every value: on the
quality text in fp32 compute, SmolLM2's KLD vs fp32 KV is 0.0033 with a scale per row and
0.0013 with groups of 32, Gemma-3-270M's 0.017 and 0.0017 (keys carry 90% of it). The scales
cost 1/8 of the int8 bytes (72 bytes per row at head dim 64 against 128 in bf16: 1.78x the
tokens per GB). Every writer (the caches' ``update``, a fused stack writing through
``block_buffers()``) stores the same bytes for the same row: the arithmetic is fp32 division
and rounding, reproduced exactly in C++.
"""

from __future__ import annotations

import argparse
import functools

import torch

from pace_core.errors import ConfigError

AUTO = "auto"
INT8 = "int8"
KV_DTYPES: tuple[str, ...] = (AUTO, INT8)
"""The ``kv_cache_dtype`` values: ``auto`` (the model dtype) and ``int8``."""

GROUP = 32  # values per scale
SCALE_BYTES = 4  # an fp32 scale


def coerce_kv_dtype(value: str | torch.dtype | None) -> str:
    """``value`` as a name of :data:`KV_DTYPES` (None means auto: the model's own dtype)."""
    if value is None:
        return AUTO
    if value == torch.int8:
        return INT8
    name = str(value).removeprefix("torch.").lower()
    if name not in KV_DTYPES:
        raise ConfigError(
            f"kv_cache_dtype {value!r} is not supported; choose one of {', '.join(KV_DTYPES)}"
        )
    return name


def add_kv_cache_dtype_argument(parser: argparse.ArgumentParser) -> None:
    """``--kv-cache-dtype`` (``pace generate``, ``pace serve``)."""
    parser.add_argument(
        "--kv-cache-dtype",
        default=AUTO,
        choices=KV_DTYPES,
        help="KV cache storage: auto (the model dtype) or int8 (half the bytes of bf16 per "
        "token; paged and slab_pool caches)",
    )


def row_bytes(kv_dtype: str, dtype: torch.dtype, width: int) -> int:
    """Bytes one (token, KV head) row of ``width`` values takes in the cache (scales
    included)."""
    if kv_dtype == INT8:
        return pool_width(kv_dtype, width)
    return width * torch.empty(0, dtype=dtype).element_size()


def pool_width(kv_dtype: str, width: int) -> int:
    """The last dim of a pool holding rows of ``width`` values."""
    if kv_dtype != INT8:
        return width
    return width + SCALE_BYTES * -(-width // GROUP)


@functools.cache
def values_of(row_width: int) -> int:
    """The values ``D`` of an int8 row of ``row_width`` bytes (the inverse of
    :func:`pool_width`, which grows strictly with ``D``)."""
    d = max(0, row_width - SCALE_BYTES) * GROUP // (GROUP + SCALE_BYTES)  # a lower bound
    while pool_width(INT8, d) < row_width:
        d += 1
    if pool_width(INT8, d) != row_width:
        raise ValueError(f"{row_width} bytes is not an int8 KV row")
    return d


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., D]`` -> (int8 ``[..., D]``, fp32 scales ``[..., ceil(D / 32)]``)."""
    d = x.shape[-1]
    groups = -(-d // GROUP)
    xf = torch.nn.functional.pad(x.float(), (0, groups * GROUP - d)).unflatten(-1, (groups, GROUP))
    amax = xf.abs().amax(-1, keepdim=True)
    scale = amax / 127.0
    q = torch.where(amax > 0, xf / scale, torch.zeros_like(xf))
    q = torch.round(q).clamp_(-127, 127).to(torch.int8).flatten(-2)[..., :d]
    return q, scale.squeeze(-1)


def dequantize_rows(
    q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``q * scale`` per group (fp32 math) in ``dtype``."""
    d = q.shape[-1]
    per_value = scales.repeat_interleave(GROUP, dim=-1)[..., :d]
    return (q.float() * per_value).to(dtype)


def pack_rows(x: torch.Tensor) -> torch.Tensor:
    """``x [..., D]`` as int8 cache rows (values, then the fp32 scales)."""
    q, scales = quantize_rows(x)
    return torch.cat([q, scales.contiguous().view(torch.int8)], dim=-1)


def unpack_rows(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Int8 cache rows de-quantized to ``[..., D]`` (fp32 math) in ``dtype``."""
    d = values_of(rows.shape[-1])
    scales = rows[..., d:].contiguous().view(torch.float32)
    return dequantize_rows(rows[..., :d], scales, dtype)
