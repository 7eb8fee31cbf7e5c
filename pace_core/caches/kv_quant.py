"""The KV cache storage dtypes (``kv_cache_dtype``) and the int8 KV format.

``"auto"`` stores keys and values in the model's dtype. ``"int8"`` stores each (token, KV
head) row of ``D`` values as ``D + 4`` bytes: ``D`` int8 values, then their fp32 scale (native
byte order), so an int8 pool is an int8 tensor ``[blocks, H, block_size, D + 4]`` that block
copies, the disk tier and copy-on-write move like any other. Symmetric, per row: ``scale =
amax / 127``, ``q = round(x / scale)`` (to nearest even, clamped to ±127; a zero row is
zeros with scale 0), read back as ``q * scale`` in fp32. A row is quantized once, when it is
written, and never rewritten, so incremental writes (decode, prefill chunks) need no
re-scaling of older tokens; the scale costs 4 bytes per row (~6% of the int8 row at head
dim 64, ~1.6% at 256). Every writer (the caches' ``update``, a fused stack writing through
``block_buffers()``) produces the same bytes for the same row: the arithmetic above is fp32
division and rounding, exactly reproducible in C++.
"""

from __future__ import annotations

import argparse

import torch

from pace_core.errors import ConfigError

AUTO = "auto"
INT8 = "int8"
KV_DTYPES: tuple[str, ...] = (AUTO, INT8)
"""The ``kv_cache_dtype`` values: ``auto`` (the model dtype) and ``int8``."""

SCALE_BYTES = 4  # one fp32 scale per (token, KV head) row


def coerce_kv_dtype(value: str | torch.dtype | None) -> str:
    """``value`` as a name of :data:`KV_DTYPES` (None and the model's dtype mean auto)."""
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
    """Bytes one (token, KV head) row of ``width`` values takes in the cache (scale
    included)."""
    if kv_dtype == INT8:
        return width + SCALE_BYTES if width else 0
    return width * torch.empty(0, dtype=dtype).element_size()


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., D]`` -> (int8 ``[..., D]``, fp32 scales ``[...]``), one scale per row."""
    xf = x.float()
    amax = xf.abs().amax(-1, keepdim=True)
    scale = amax / 127.0
    q = torch.where(amax > 0, xf / scale, torch.zeros_like(xf))
    return torch.round(q).clamp_(-127, 127).to(torch.int8), scale.squeeze(-1)


def pack_rows(x: torch.Tensor) -> torch.Tensor:
    """``x [..., D]`` as int8 cache rows ``[..., D + 4]`` (values, then the fp32 scale)."""
    q, scale = quantize_rows(x)
    return torch.cat([q, scale.unsqueeze(-1).view(torch.int8)], dim=-1)


def unpack_rows(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Int8 cache rows ``[..., D + 4]`` de-quantized to ``[..., D]`` (fp32 math) in
    ``dtype``."""
    d = rows.shape[-1] - SCALE_BYTES
    scales = rows[..., d:].contiguous().view(torch.float32).squeeze(-1)
    return dequantize_rows(rows[..., :d], scales, dtype)


def pool_width(kv_dtype: str, width: int) -> int:
    """The last dim of a pool holding rows of ``width`` values."""
    return width + SCALE_BYTES if kv_dtype == INT8 and width else width


def dequantize_rows(
    q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``q * scale`` per row (fp32 math) in ``dtype``."""
    return (q.float() * scales.unsqueeze(-1)).to(dtype)
