"""An engine's warm-up before it serves: the KV pool committed, the prefill rate measured."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from pace_core.engine.prefill_budget import PrefillBudget
from pace_core.models.decoder import forward_step

log = logging.getLogger("pace.engine.core")  # part of the engine's log

WARM_UP_TOKENS = 128
"""Prompt tokens of the warm-up prefill."""
MEASURED_FORWARDS = 2
"""Timed warm-up prefills; the rate comes from the fastest (anything else running on the
cores only slows a forward down)."""


def warm_up(
    model: Any, cache: Any, budget: PrefillBudget, max_context: int, name: str = "0"
) -> float | None:
    """Commit ``cache``'s pages (``populate``: no page faults in the steps), then run
    prefill forwards of a throwaway sequence: one, then ``MEASURED_FORWARDS`` timed ones, the
    fastest of which sets ``budget``'s rate.
    Returns that rate (prompt tokens/s), or None when the context is too short to measure it.

    The first forward of a process pays one-time costs (lazy set-up, first touches of
    workspaces and cache pages): measured from it, the rate came out at half (SmolLM2,
    2 threads: 935 instead of 1880 tokens/s), and with 32 users always decoding no later
    forward prefills alone to correct it, so every slice was half as long as it should be
    (-15% tokens/s in a closed-loop replay). The sequence is never indexed for prefix
    caching, and its blocks are freed before this returns.
    """
    committed = cache.populate()
    log.info("engine %s: KV pool committed (%.0f MB)", name, committed / 2**20)
    capacity = int(cache.num_blocks) * int(cache.block_size)
    tokens = min(WARM_UP_TOKENS, budget.max_tokens, max_context - 1, capacity)
    if tokens < budget.rate_min_tokens:
        return None
    ids = (torch.arange(tokens, dtype=torch.long) % model.vocab_size)[None]
    (seq_id,) = cache.add_sequences(1)
    try:
        with torch.inference_mode():
            forward_step(model, cache, [seq_id], ids, [tokens])  # pays the one-time costs
            fastest = float("inf")
            for _ in range(MEASURED_FORWARDS):
                cache.free_sequence(seq_id)
                (seq_id,) = cache.add_sequences(1)
                start = time.perf_counter()
                forward_step(model, cache, [seq_id], ids, [tokens])
                fastest = min(fastest, time.perf_counter() - start)
            budget.record(tokens, fastest)
    finally:
        cache.free_sequence(seq_id)
    log.info("engine %s: prefill rate %.0f tokens/s (warm-up)", name, budget.rate)
    return budget.rate
