"""DLRMv2 in plain torch, from a state dict in torchrec's ``DLRM_DCN`` naming: the reference
the pace model is tested against and the "torch eager" / ``torch.compile`` contender of
``pace bench dlrm``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pace_core.dlrm import names
from pace_core.dlrm.config import DLRMConfig


class ReferenceDLRM(nn.Module):
    """``forward(dense [B, F], indices, offsets) -> logits [B]`` (fp32 math in ``dtype``):
    bottom MLP (ReLU after every layer), sum-pooled ``F.embedding_bag`` per table
    (``offsets`` [B + 1] each), ``cat`` in torchrec's order (bottom output first), the DCNv2
    cross stack, the top MLP (ReLU but after the last layer)."""

    def __init__(
        self,
        config: DLRMConfig,
        state: Mapping[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.config = config

        def param(name: str) -> nn.Parameter:
            return nn.Parameter(state[name].to(dtype), requires_grad=False)

        self.tables = nn.ParameterList([param(n) for n in names.tables(config)])
        self.bottom = nn.ParameterList(
            [param(f"{n}.{p}") for n in names.bottom(config) for p in ("weight", "bias")]
        )
        self.top = nn.ParameterList(
            [param(f"{n}.{p}") for n in names.top(config) for p in ("weight", "bias")]
        )
        self.cross = nn.ParameterList([param(n) for layer in names.cross(config) for n in layer])

    def forward(
        self, dense: torch.Tensor, indices: Sequence[torch.Tensor], offsets: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        x = dense.to(self.tables[0].dtype)
        for i in range(0, len(self.bottom), 2):
            x = F.relu(F.linear(x, self.bottom[i], self.bottom[i + 1]))
        bags = [
            F.embedding_bag(idx, table, off, mode="sum", include_last_offset=True)
            for table, idx, off in zip(self.tables, indices, offsets, strict=True)
        ]
        x0 = torch.cat([x, *bags], dim=1)
        xl = x0
        for i in range(0, len(self.cross), 3):
            v, u, b = self.cross[i], self.cross[i + 1], self.cross[i + 2]
            xl = x0 * F.linear(F.linear(xl, v), u, b) + xl
        z = xl
        last = len(self.top) - 2
        for i in range(0, len(self.top), 2):
            z = F.linear(z, self.top[i], self.top[i + 1])
            if i < last:
                z = F.relu(z)
        return z.float().reshape(-1)
