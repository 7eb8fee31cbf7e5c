"""The ``fn`` half of each kernel: thin calls into the C++ extension (``csrc/bindings.cpp``).

Signatures follow ``pace_core.ops``; results match ``pace_native.kernels`` (fp32 accumulation,
one rounding to the activation dtype at the end).
"""

from __future__ import annotations

from typing import Any

import torch
from pace_native import kernels as native

from pace_avx512 import build
from pace_avx512.packing import PackedGatedMLP, PackedLinear, PackedQKV

# Queries per row up to which attention runs here; longer (prefill) goes to torch SDPA via
# pace-native, whose flash kernel is the better tool there.
DECODE_MAX_QUERIES = 16


def _ext():
    return build.load_extension()  # a global check once loaded


def linear(x: torch.Tensor, w: PackedLinear) -> torch.Tensor:
    return _ext().linear(x, w.weight, w.bias, w.out_features)


def qkv_proj(x: torch.Tensor, w: PackedQKV) -> tuple[torch.Tensor, ...]:
    lin = w.linear
    return _ext().linear(x, lin.weight, lin.bias, lin.out_features).split(w.sizes, dim=-1)


def gated_mlp(x: torch.Tensor, w: PackedGatedMLP) -> torch.Tensor:
    return _ext().gated_mlp(x, w.gate_up, w.down, w.intermediate, w.hidden, w.activation)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    return _ext().rms_norm(x, weight, eps, residual)


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: ``q`` and ``k`` are rotated and returned (no copies of the heads)."""
    return _ext().rope(q, k, cos, sin, interleaved)


def attention(
    q: torch.Tensor, kv: Any, scale: float, sinks: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """Decode attention over a contiguous cache view; prefill and other layouts: native."""
    if q.shape[2] > DECODE_MAX_QUERIES or getattr(kv, "layout", "contiguous") != "contiguous":
        return native.attention(q, kv, scale, sinks, window)
    return _ext().attention(q, kv.keys, kv.values, kv.meta.mask(window), scale, sinks)
