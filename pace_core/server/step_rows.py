"""The rows of one engine forward: which prompt chunks an iteration takes, how chunks are
grouped when they run as forwards of their own, and the id batch of a step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch

from pace_core.engine.generate import left_pad

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


def step_batch(
    lasts: Sequence[int], chunks: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, list[int]]:
    """The ids of one forward: a row per decode (its last token) and then a row per prompt
    chunk, right-aligned in ``[B, W]`` (W = the longest chunk, 1 without chunks), and the
    token count of each row."""
    counts = [1] * len(lasts) + [int(c.numel()) for c in chunks]
    batch = torch.zeros(len(counts), max(counts), dtype=torch.long)
    if lasts:
        batch[: len(lasts), -1] = torch.tensor(lasts, dtype=torch.long)
    if chunks:
        ids, _ = left_pad(chunks)
        batch[len(lasts) :, batch.shape[1] - ids.shape[1] :] = ids
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

