"""Contiguous caches: one dense ``[B, H, capacity, D]`` buffer per layer, a row per sequence.

- DYNAMIC grows geometrically (capacity doubles), so appending N tokens copies O(N) in total.
- BMC grows in fixed segments of ``max_seq_len / num_splits`` tokens (default splits:
  ``sqrt(max_seq_len)``, ``PACE_BMC_NUM_SPLITS``), reallocating at most once per segment.

Row ids are positions in the dense batch; :meth:`retain` compacts and renumbers them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pace_core.caches.base import StepMeta
from pace_core.errors import ConfigError


@dataclass(frozen=True)
class ContiguousKV:
    """Attention view of one layer: keys/values ``[B, H, S, D]``, S = longest row."""

    keys: torch.Tensor
    values: torch.Tensor
    meta: StepMeta


class ContiguousCache:
    """Dense per-layer K/V with per-row lengths; subclasses choose the growth policy."""

    layout = "contiguous"

    def __init__(
        self,
        num_kv_heads: Sequence[int],
        head_dims: Sequence[int],
        dtype: torch.dtype,
        *,
        value_dims: Sequence[int] | None = None,
        **_: object,
    ) -> None:
        self.num_kv_heads, self.head_dims, self.dtype = list(num_kv_heads), list(head_dims), dtype
        self.capacity = 0
        self.lens: list[int] = []  # tokens per row
        self.keys = [self._alloc(0, h, d, 0) for h, d in zip(num_kv_heads, head_dims)]
        dims = head_dims if value_dims is None else value_dims
        self.values = [self._alloc(0, h, d, 0) for h, d in zip(num_kv_heads, dims)]
        self._meta: StepMeta | None = None

    def _alloc(self, batch: int, heads: int, dim: int, capacity: int) -> torch.Tensor:
        return torch.zeros(batch, heads, capacity, dim, dtype=self.dtype)

    def grow_to(self, needed: int) -> int:
        """The new capacity for at least ``needed`` tokens per row."""
        raise NotImplementedError

    # -- sequences -------------------------------------------------------------------------
    @property
    def batch(self) -> int:
        return len(self.lens)

    def add_sequences(self, count: int) -> list[int]:
        start = self.batch
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                extra = t.new_zeros(count, t.shape[1], t.shape[2], t.shape[3])
                store[i] = torch.cat([t, extra]) if start else extra
        self.lens += [0] * count
        return list(range(start, start + count))

    def reserve(self, tokens: int) -> None:
        """Make room for ``tokens`` per row now (a generation's prompt plus its token budget),
        so its steps never grow the buffers; memory past a row's length stays unused."""
        if tokens > self.capacity:
            self._resize(self.grow_to(tokens))

    def retain(self, seq_ids: list[int]) -> list[int]:
        if seq_ids != list(range(self.batch)):
            rows = torch.tensor(seq_ids, dtype=torch.long)
            for store in (self.keys, self.values):
                for i, t in enumerate(store):
                    store[i] = t.index_select(0, rows)
            self.lens = [self.lens[i] for i in seq_ids]
        return list(range(len(seq_ids)))

    # -- steps -----------------------------------------------------------------------------
    def begin_step(self, seq_ids: list[int], num_new, width: int) -> StepMeta:
        if seq_ids != list(range(self.batch)):
            raise ValueError(
                "contiguous caches step over all their rows in order; call retain() first"
            )
        meta = StepMeta(list(seq_ids), list(self.lens), num_new, width)
        needed = meta.max_len
        if needed > self.capacity:
            self._resize(self.grow_to(needed))
        self._meta = meta
        return meta

    def _resize(self, capacity: int) -> None:
        keep = max(self.lens, default=0)
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = old.new_zeros(old.shape[0], old.shape[1], capacity, old.shape[3])
                new[:, :, :keep] = old[:, :, :keep]
                store[i] = new
        self.capacity = capacity

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> ContiguousKV:
        meta = self._meta
        keys, values = self.keys[layer], self.values[layer]
        if meta.uniform:
            start = meta.uniform_start
            keys.narrow(2, start, meta.width).copy_(k)
            values.narrow(2, start, meta.width).copy_(v)
        elif meta.width == 1:
            rows = torch.arange(self.batch)
            keys[rows, :, meta.lens_before] = k[:, :, 0]
            values[rows, :, meta.lens_before] = v[:, :, 0]
        else:
            for b, (start, n) in enumerate(zip(meta.starts, meta.counts)):
                keys[b, :, start : start + n] = k[b, :, meta.width - n :]
                values[b, :, start : start + n] = v[b, :, meta.width - n :]
        s = meta.max_len
        return ContiguousKV(keys.narrow(2, 0, s), values.narrow(2, 0, s), meta)

    def direct_buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer K/V buffers ``[B, H, capacity, D]`` for fused decoder stacks, which may
        write a step's keys/values themselves instead of calling :meth:`update`, exactly as
        it does: row ``b``'s last ``meta.num_new[b]`` positions at ``meta.lens_before[b]``."""
        return self.keys, self.values

    def end_step(self) -> None:
        self.lens = list(self._meta.ends)  # crop() edits lens in place
        self._meta = None

    # -- inspection and rollback ---------------------------------------------------------
    def crop(self, seq_id: int, num_tokens: int) -> None:
        have = self.lens[seq_id]
        if not 0 <= num_tokens <= have:
            raise ValueError(f"cannot crop {num_tokens} tokens from sequence {seq_id} of {have}")
        self.lens[seq_id] = have - num_tokens

    def get_num_tokens(self, seq_id: int) -> int:
        return self.lens[seq_id]

    def get_kv_states(self, seq_id: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        n = self.lens[seq_id]
        return [
            (k[seq_id, :, :n].clone(), v[seq_id, :, :n].clone())
            for k, v in zip(self.keys, self.values)
        ]

    def memory_used(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def memory_free(self) -> int:
        return 0


class DynamicCache(ContiguousCache):
    """DYNAMIC: capacity doubles when exceeded (amortised O(1) per token)."""

    def grow_to(self, needed: int) -> int:
        return max(needed, 2 * self.capacity, 64)


class BMCCache(ContiguousCache):
    """BMC: capacity grows by whole segments of ``max_seq_len / num_splits`` tokens."""

    layout = "contiguous"

    def __init__(
        self,
        num_kv_heads: Sequence[int],
        head_dims: Sequence[int],
        dtype: torch.dtype,
        *,
        max_seq_len: int = 4096,
        num_splits: int | None = None,
        value_dims: Sequence[int] | None = None,
        **_: object,
    ) -> None:
        super().__init__(num_kv_heads, head_dims, dtype, value_dims=value_dims)
        env = os.environ.get("PACE_BMC_NUM_SPLITS")
        if num_splits is None:
            num_splits = int(env) if env else max(1, round(math.sqrt(max_seq_len)))
        if num_splits < 1:
            raise ConfigError(f"PACE_BMC_NUM_SPLITS must be >= 1 (got {num_splits})")
        self.segment = max(1, math.ceil(max_seq_len / num_splits))
        self.reallocations = 0

    def grow_to(self, needed: int) -> int:
        self.reallocations += 1
        return math.ceil(needed / self.segment) * self.segment
