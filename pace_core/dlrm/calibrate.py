"""Calibrated (static) int8 activation scales for DLRMv2: the fp32 model runs over sample
batches and every int8 matrix's input keeps the largest magnitude seen per 32 values; its
static scale is that over 127 (the W8A8 kernels then quantize with it instead of a dynamic
scale per sample, clamping values past the calibrated range)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from pace_core.dlrm import names
from pace_core.dlrm.config import DLRMConfig
from pace_core.dlrm.features import check_dense, sparse_bags
from pace_core.dlrm.quantize import ACT_GROUP

Batch = Any  # a ClickBatch, or (dense [B, F], sparse) as DLRM.predict takes them


class _Ranges:
    """The running amax per 32 values of each named matrix's input."""

    def __init__(self) -> None:
        self.amax: dict[str, torch.Tensor] = {}

    def see(self, name: str, x: torch.Tensor) -> None:
        k = x.shape[-1]
        if k % ACT_GROUP:  # stays in the model dtype (DLRMQuantization.matrix)
            return
        group = x.detach().float().abs().reshape(-1, k // ACT_GROUP, ACT_GROUP).amax(dim=(0, 2))
        seen = self.amax.get(name)
        self.amax[name] = group if seen is None else torch.maximum(seen, group)


def _parts(batch: Batch) -> tuple[torch.Tensor, Any]:
    if hasattr(batch, "dense"):
        return batch.dense, batch.sparse
    dense, sparse = batch
    return dense, sparse


@torch.no_grad()
def activation_scales(
    config: DLRMConfig, state: Mapping[str, torch.Tensor], batches: Iterable[Batch]
) -> dict[str, torch.Tensor]:
    """Static scales ``fp32 [K // 32]`` by weight name (``bottom_model.mlp.1.weight``, a
    cross layer's V and U, ...) for every matrix whose row length is a multiple of 32, from the
    fp32 model (``state``) over ``batches``."""
    seen = _Ranges()
    count = 0
    for batch in batches:
        dense, sparse = _parts(batch)
        dense = check_dense(dense, config).float()
        indices, offsets = sparse_bags(sparse, config, int(dense.shape[0]))
        _forward(config, state, dense, indices, offsets, seen)
        count += int(dense.shape[0])
    if not count:
        raise ValueError("DLRM calibration needs at least one sample")
    return {name: (amax / 127.0).contiguous() for name, amax in seen.amax.items()}


def _forward(config: DLRMConfig, state: Mapping[str, torch.Tensor], dense: torch.Tensor,
             indices: list[torch.Tensor], offsets: list[torch.Tensor],
             seen: _Ranges) -> None:  # fmt: skip
    """The reference forward (:class:`~pace_core.dlrm.reference.ReferenceDLRM`'s), recording
    each matrix's input."""

    def linear(x: torch.Tensor, module: str) -> torch.Tensor:
        seen.see(f"{module}.weight", x)
        return F.linear(x, state[f"{module}.weight"].float(), state[f"{module}.bias"].float())

    x = dense
    for module in names.bottom(config):
        x = F.relu(linear(x, module))
    bags = [
        F.embedding_bag(i, state[t].float(), o, mode="sum", include_last_offset=True)
        for t, i, o in zip(names.tables(config), indices, offsets, strict=True)
    ]
    x0 = torch.cat([x, *bags], dim=1)
    xl = x0
    for v, u, b in names.cross(config):
        seen.see(v, xl)
        h = F.linear(xl, state[v].float())
        seen.see(u, h)
        xl = x0 * F.linear(h, state[u].float(), state[b].float()) + xl
    top = names.top(config)
    for i, module in enumerate(top):
        xl = linear(xl, module)
        if i < len(top) - 1:
            xl = F.relu(xl)


__all__ = ["activation_scales"]
