"""Prefill of a batch whose prompts share prefixes, over a prefix-caching block cache.

Every prompt first adopts the full blocks the cache already holds
(:meth:`~pace_core.caches.blocks.BlockCache.adopt_prefix`). Prompts that share a further full
block with an earlier prompt of the same batch wait for a second forward: the first forward
computes (and indexes) the shared blocks once, then the waiting prompts adopt them and compute
only their own remainder. ``LLMModel.generate`` over many prompts with one long instruction
thus computes the instruction once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pace_core.caches.block_pool import block_keys
from pace_core.engine.generate import forward_step, left_pad, prefill
from pace_core.models.decoder import DecoderLM

__all__ = ["prefill_sharing", "waves"]


def waves(cache: object, prompts: Sequence[torch.Tensor]) -> tuple[list[int], list[int]]:
    """(rows prefilled first, rows that wait): a row waits when its first block the cache
    does not hold is also a block of an earlier first-wave prompt."""
    bs = cache.block_size
    first, later, seen = [], [], set()
    for i, p in enumerate(prompts):
        tokens = p.tolist()
        keys = block_keys(tokens, bs)
        start = cache.cached_prefix_tokens(tokens) // bs
        reusable = (len(tokens) - 1) // bs
        if start < reusable and keys[start] in seen:
            later.append(i)
        else:
            first.append(i)
            seen.update(keys)
    return first, later


def _forward_rows(
    model: DecoderLM, cache: object, seq_ids: Sequence[int], prompts: Sequence[torch.Tensor]
) -> torch.Tensor:
    """Adopt each row's cached prefix, then one forward over the remainders."""
    done = [cache.adopt_prefix(s, p.tolist()) for s, p in zip(seq_ids, prompts)]
    rest = [p[d:] for p, d in zip(prompts, done)]
    ids, _ = left_pad(rest)
    return forward_step(model, cache, list(seq_ids), ids, [r.numel() for r in rest])


def prefill_sharing(
    model: DecoderLM, cache: object, seq_ids: list[int], prompts: Sequence[torch.Tensor]
) -> torch.Tensor:
    """Logits ``[B, V]`` of each prompt's last token; see the module doc. Without prefix
    caching this is :func:`~pace_core.engine.generate.prefill`."""
    if not getattr(cache, "prefix_caching", False):
        return prefill(model, cache, seq_ids, prompts)
    first, later = waves(cache, prompts)
    out: list[torch.Tensor | None] = [None] * len(prompts)
    for rows in (first, later):
        if not rows:
            continue
        logits = _forward_rows(model, cache, [seq_ids[i] for i in rows], [prompts[i] for i in rows])
        for j, i in enumerate(rows):
            out[i] = logits[j]
    return torch.stack(out)  # type: ignore[arg-type]
