"""Torch reference kernels of the DLRMv2 ops: ``embedding_bag`` and ``cross_interaction``
(signatures in ``pace_core.ops``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from pace_core.quant import QuantizedWeight
from pace_native.kernels import LinearWeight, linear, prepare_linear


@dataclass(frozen=True)
class BagTable:
    """A table as ``embedding_bag`` reads it: dense rows, or int8 codes with a scale per row."""

    weight: torch.Tensor  # [V, D] in the model dtype, or int8 codes
    scales: torch.Tensor | None  # fp32 [V] for int8 codes
    dtype: torch.dtype  # the output dtype (the model dtype)


def table_codes(weight: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes int8 [V, D], scales fp32 [V])`` of an int8 table with one scale per row;
    raises ``ValueError`` for any other quantized table."""
    v, d = weight.shape
    if weight.format != "int8" or weight.scales is None or weight.scales.shape != (v, 1):
        raise ValueError(
            f"embedding_bag takes dense tables or int8 ones with one scale per row "
            f"(group_size {d}); got {weight.format} with group_size {weight.group_size}"
        )
    return weight.data.contiguous(), weight.scales.float().reshape(v).contiguous()


def prepare_embedding_bag(weight: torch.Tensor | QuantizedWeight) -> BagTable:
    if isinstance(weight, QuantizedWeight):
        codes, scales = table_codes(weight)
        return BagTable(codes, scales, weight.dtype)
    return BagTable(weight.contiguous(), None, weight.dtype)


def embedding_bag(indices: torch.Tensor, offsets: torch.Tensor, w: BagTable) -> torch.Tensor:
    """Bag ``b`` = the sum of rows ``indices[offsets[b]:offsets[b + 1]]`` (fp32 sums)."""
    if w.scales is None and w.weight.dtype == torch.float32:
        return F.embedding_bag(indices, w.weight, offsets, mode="sum", include_last_offset=True)
    rows = w.weight[indices].float()
    if w.scales is not None:
        rows *= w.scales[indices].unsqueeze(1)
    ids = torch.arange(rows.shape[0], device=rows.device)
    out = F.embedding_bag(ids, rows, offsets, mode="sum", include_last_offset=True)
    return out.to(w.dtype)


@dataclass(frozen=True)
class CrossLayers:
    """The cross stack's layers: ``(V, U + b)`` as prepared linears."""

    layers: tuple[tuple[LinearWeight, LinearWeight], ...]


def prepare_cross_interaction(layers: Sequence[tuple[Any, Any, torch.Tensor]]) -> CrossLayers:
    return CrossLayers(tuple((prepare_linear(v), prepare_linear(u, b)) for v, u, b in layers))


def cross_interaction(x0: torch.Tensor, w: CrossLayers) -> torch.Tensor:
    """``x_{l+1} = x0 * (U_l (V_l x_l) + b_l) + x_l``, ``x_0 = x0``."""
    xl = x0
    for v, u in w.layers:
        xl = torch.addcmul(xl, x0, linear(linear(xl, v), u))
    return xl
