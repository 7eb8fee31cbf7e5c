"""The rows of one engine forward: which prompt chunks an iteration takes, how chunks are
grouped when they run as forwards of their own, and the left-padded id batch of a step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def plan_chunks(remaining: Sequence[tuple[T, int]], budget: int) -> list[tuple[T, int]]:
    """``(item, tokens)`` chunks, FIFO, of the ``remaining`` prompt tokens per item, within
    ``budget`` tokens (the last chunk taken may be a part of its prompt)."""
    chunks: list[tuple[T, int]] = []
    for item, left in remaining:
        if budget <= 0:
            break
        n = min(left, budget)
        chunks.append((item, n))
        budget -= n
    return chunks


def left_padded(rows: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """``ids [B, W]`` with row b's tokens right-aligned (W = the longest), and the counts."""
    counts = [int(r.numel()) for r in rows]
    batch = torch.zeros(len(rows), max(counts), dtype=torch.long)
    for b, row in enumerate(rows):
        batch[b, batch.shape[1] - counts[b] :] = row
    return batch, counts


def group_chunks(chunks: list[tuple[Any, int]]) -> list[list[tuple[Any, int]]]:
    """Batch prefill chunks into forwards with at most ~25% padding (rows are left-padded)."""
    groups: list[list[tuple[Any, int]]] = []
    real = 0
    for item in sorted(chunks, key=lambda c: -c[1]):
        if groups:
            g = groups[-1]
            width = g[0][1]
            if (len(g) + 1) * width <= 1.25 * (real + item[1]):
                g.append(item)
                real += item[1]
                continue
        groups.append([item])
        real = item[1]
    return groups

