"""DYNAMIC cache: one contiguous ``[B, H, capacity, D]`` buffer per layer, grown geometrically.

Growth doubles the capacity, so appending N tokens one at a time copies O(N) elements in total.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class DynamicCache:
    """Contiguous per-layer K/V for a batch whose rows share slot indices (left padding)."""

    layout = "contiguous"

    def __init__(
        self,
        batch: int,
        num_kv_heads: Sequence[int],
        head_dims: Sequence[int],
        dtype: torch.dtype,
        initial_capacity: int = 256,
    ) -> None:
        self.batch = batch
        self.length = 0
        self.capacity = initial_capacity
        self.keys = [torch.empty(batch, h, initial_capacity, d, dtype=dtype)
                     for h, d in zip(num_kv_heads, head_dims)]  # fmt: skip
        self.values = [torch.empty_like(k) for k in self.keys]

    def _grow(self, needed: int) -> None:
        new_cap = max(needed, 2 * self.capacity)
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = old.new_empty(old.shape[0], old.shape[1], new_cap, old.shape[3])
                new[:, :, : self.length] = old[:, :, : self.length]
                store[i] = new
        self.capacity = new_cap

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v [B, H, T, D]`` after the current length; return all keys/values so far."""
        end = self.length + k.shape[2]
        if end > self.capacity:
            self._grow(end)
        self.keys[layer][:, :, self.length : end] = k
        self.values[layer][:, :, self.length : end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, num_tokens: int) -> None:
        """Commit the tokens written by the last forward pass."""
        self.length += num_tokens

    def crop(self, num_tokens: int) -> None:
        """Drop the last ``num_tokens`` tokens (speculative rollback)."""
        if not 0 <= num_tokens <= self.length:
            raise ValueError(f"cannot crop {num_tokens} tokens from a cache of {self.length}")
        self.length -= num_tokens

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only batch ``rows`` (finished sequences leave, beams reorder)."""
        for store in (self.keys, self.values):
            for i, t in enumerate(store):
                store[i] = t.index_select(0, rows)
        self.batch = int(rows.numel())

    def get_num_tokens(self) -> int:
        return self.length

    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))
