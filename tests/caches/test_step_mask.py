"""The attention masks of a forward step against a per-element reference."""

from __future__ import annotations

import random

import pytest
import torch

from pace_core.caches.base import ChunkedWindow, StepMeta

WINDOWS = [None, 1, 3, 16, ChunkedWindow(4), ChunkedWindow(32)]


def reference(meta: StepMeta, window) -> torch.Tensor:
    """Row b's real query t (position p) sees key k iff k <= p, and k is inside the window;
    a pad query sees key 0 only."""
    width, keys = meta.width, meta.max_len
    out = torch.zeros(len(meta.seq_ids), 1, width, keys, dtype=torch.bool)
    for b, (start, count) in enumerate(zip(meta.starts, meta.counts)):
        for t in range(width):
            if t < width - count:
                out[b, 0, t, 0] = True
                continue
            p = start + t - (width - count)
            for k in range(p + 1):
                if isinstance(window, ChunkedWindow):
                    out[b, 0, t, k] = k // window.size == p // window.size
                else:
                    out[b, 0, t, k] = window is None or p - k < window
    return out


@pytest.mark.parametrize("window", WINDOWS, ids=str)
def test_step_masks_are_causal_windowed_and_pads_see_key_zero(window):
    rng = random.Random(7)
    for _ in range(30):
        rows = rng.randint(1, 5)
        counts = [rng.randint(1, 9) for _ in range(rows)]
        width = max(counts) + rng.choice([0, 0, 2])  # padded widths too
        starts = [rng.randint(0, 40) for _ in range(rows)]
        meta = StepMeta(list(range(rows)), starts, counts, width)
        assert torch.equal(meta.mask(window), reference(meta, window)), (starts, counts, width)
    decode = StepMeta([0, 1, 2], [5, 0, 33], [1, 1, 1], 1)  # its own builder
    assert torch.equal(decode.mask(window), reference(decode, window))
