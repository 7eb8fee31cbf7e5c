"""DLRM inputs: checks that name the bad value and the fix, and the conversion of the sparse
features to the ``(indices, offsets)`` pairs op ``embedding_bag`` takes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pace_core.dlrm.config import DLRMConfig
from pace_core.errors import PaceError

Sparse = Sequence[Any] | torch.Tensor
"""Sparse features: one ``[B, L]`` integer tensor per table (fixed multi-hot), one
``(indices [N], offsets [B + 1])`` pair per table (ragged bags), or one ``[B, T]`` tensor
(a single id per table) / ``[B, T, L]`` tensor (L ids per table)."""

_OFFSETS: dict[tuple[int, int], torch.Tensor] = {}  # (B, L) -> arange(0, B L + 1, L)


class DLRMInputError(PaceError, ValueError):
    """Features that do not fit the model (count, shape, dtype or an id out of range)."""


def _offsets(batch: int, hot: int) -> torch.Tensor:
    key = (batch, hot)
    found = _OFFSETS.get(key)
    if found is None:
        if len(_OFFSETS) > 64:
            _OFFSETS.clear()
        found = _OFFSETS[key] = torch.arange(0, batch * hot + 1, max(hot, 1)) if hot else (
            torch.zeros(batch + 1, dtype=torch.long))  # fmt: skip
    return found


def fixed_hotness(sparse: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``[B, L]`` id tensors -> flat indices and offsets (shared per (B, L)), unchecked."""
    indices = [t.reshape(-1) for t in sparse]
    offsets = [_offsets(int(t.shape[0]), int(t.shape[1])) for t in sparse]
    return indices, offsets


def _ids(t: Any, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise DLRMInputError(f"{what} is a {type(t).__name__}, not a tensor; pass torch tensors")
    if t.dtype == torch.long:
        return t
    if t.dtype in (torch.int32, torch.int16, torch.uint8, torch.int8):
        return t.long()
    raise DLRMInputError(
        f"{what} has dtype {str(t.dtype).removeprefix('torch.')}; sparse features are integer "
        "row ids: pass int64 (or int32) tensors, e.g. ids.long() from whole numbers"
    )


def check_dense(dense: Any, config: DLRMConfig) -> torch.Tensor:
    """``dense [B, F]``: finite floating point values, ``F = config.dense_features``."""
    if not isinstance(dense, torch.Tensor):
        raise DLRMInputError(f"dense features are a {type(dense).__name__}; pass a tensor")
    if not dense.is_floating_point():
        raise DLRMInputError(
            f"dense features have dtype {str(dense.dtype).removeprefix('torch.')}; they must be "
            "floating point (convert with .float())"
        )
    if dense.dim() != 2 or dense.shape[1] != config.dense_features:
        raise DLRMInputError(
            f"dense features have shape {tuple(dense.shape)}; this model takes "
            f"[batch, {config.dense_features}] (DLRMConfig.dense_features)"
        )
    finite = torch.isfinite(dense).all(dim=1)
    if not bool(finite.all()):  # NaN in, NaN scores out: say which samples instead
        rows = (~finite).nonzero().flatten().tolist()
        shown = ", ".join(map(str, rows[:8])) + (", ..." if len(rows) > 8 else "")
        raise DLRMInputError(
            f"dense features of {len(rows)} sample(s) hold NaN or infinite values (rows "
            f"{shown}); fill or drop them first (Criteo's preprocessing takes a missing count "
            "as 0 before its log transform)"
        )
    return dense


def sparse_bags(
    sparse: Sparse, config: DLRMConfig, batch: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Check the structure of ``sparse`` (count, shapes, dtypes; ranges are checked by
    :func:`check_ranges`) and return per table ``indices`` and ``offsets``."""
    n = config.sparse_features
    if isinstance(sparse, torch.Tensor):
        t = _ids(sparse, "the sparse features tensor")
        if t.dim() not in (2, 3) or t.shape[0] != batch or t.shape[1] != n:
            raise DLRMInputError(
                f"the sparse features tensor has shape {tuple(t.shape)}; a single tensor must "
                f"be [batch={batch}, {n}] or [batch, {n}, ids per feature]"
            )
        sparse = [t[:, i].reshape(batch, -1) for i in range(n)]
    if len(sparse) != n:
        raise DLRMInputError(
            f"got {len(sparse)} sparse features; this model has {n} tables "
            f"(DLRMConfig.table_rows): pass one id tensor per table"
        )
    indices, offsets = [], []
    for i, item in enumerate(sparse):
        if isinstance(item, (tuple, list)):
            if len(item) != 2:
                raise DLRMInputError(f"sparse feature {i}: pass (indices, offsets), got "
                                     f"{len(item)} items")  # fmt: skip
            idx = _ids(item[0], f"sparse feature {i}'s indices")
            off = _ids(item[1], f"sparse feature {i}'s offsets")
            if idx.dim() != 1 or off.dim() != 1 or off.numel() != batch + 1:
                raise DLRMInputError(
                    f"sparse feature {i}: indices {tuple(idx.shape)} and offsets "
                    f"{tuple(off.shape)}; ragged bags need indices [N] and offsets "
                    f"[batch + 1 = {batch + 1}] (bag b = indices[offsets[b]:offsets[b+1]])"
                )
            indices.append(idx)
            offsets.append(off)
            continue
        t = _ids(item, f"sparse feature {i}")
        if t.dim() == 1:
            t = t.reshape(-1, 1)
        if t.dim() != 2 or t.shape[0] != batch:
            raise DLRMInputError(
                f"sparse feature {i} has shape {tuple(t.shape)}; pass [batch={batch}, ids per "
                "sample] (or an (indices, offsets) pair)"
            )
        indices.append(t.reshape(-1))
        offsets.append(_offsets(batch, int(t.shape[1])))
    return indices, offsets


def check_ranges(indices: Sequence[torch.Tensor], offsets: Sequence[torch.Tensor],
                 config: DLRMConfig) -> None:  # fmt: skip
    """Raise :class:`DLRMInputError` naming the first feature with an id outside its table or
    offsets that are not a valid bag split."""
    for i, (idx, off, rows) in enumerate(zip(indices, offsets, config.table_rows, strict=True)):
        if off.numel() and (int(off[0]) < 0 or int(off[-1]) > idx.numel()
                            or bool((off[1:] < off[:-1]).any())):  # fmt: skip
            raise DLRMInputError(
                f"sparse feature {i}: offsets must rise from >= 0 to at most {idx.numel()} "
                "(the number of indices)"
            )
        if idx.numel():
            lo, hi = int(idx.min()), int(idx.max())
            if lo < 0 or hi >= rows:
                bad = lo if lo < 0 else hi
                raise DLRMInputError(
                    f"sparse feature {i} has id {bad}, outside its table's {rows} rows "
                    f"(valid ids 0..{rows - 1}); hash or clip ids into range (id % {rows})"
                )
