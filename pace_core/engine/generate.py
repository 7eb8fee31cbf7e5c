"""The batched generation loop: prefill, then one decode forward per step for live rows.

Finished rows leave the batch at once (their cache rows are dropped), so they stop costing
compute. The loop yields a :class:`StepEvent` per step; ``LLMModel`` builds outputs,
streams and iterators on top of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from pace_core.models.decoder import DecoderLM

# (row, token, hit_eos, hit_length) -> finish reason or None
FinishFn = Callable[[int, int, bool, bool], str | None]


@dataclass
class StepEvent:
    """Tokens chosen for the rows alive at this step (``rows`` are original batch indices)."""

    rows: list[int]
    tokens: list[int]
    finished: dict[int, str]  # row -> finish reason
    logits: torch.Tensor | None  # [len(rows), V] raw logits, when requested
    logprobs: torch.Tensor | None = None  # [len(rows)]
    top_ids: torch.Tensor | None = None  # [len(rows), k]
    top_logprobs: torch.Tensor | None = None


def left_pad(prompts: Sequence[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D prompts into ``ids [B, T]`` and ``valid [B, T]`` with padding on the left."""
    width = max(int(p.numel()) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(prompts), width), dtype=torch.bool)
    for i, p in enumerate(prompts):
        if p.numel():
            ids[i, width - p.numel() :] = p
            valid[i, width - p.numel() :] = True
    return ids, valid


def generation_loop(
    model: DecoderLM,
    cache: object,
    prompts: Sequence[torch.Tensor],
    sampler: object,
    finish: FinishFn,
    *,
    keep_logits: bool = False,
) -> Iterator[StepEvent]:
    """Run prefill and decode until every row has finished; ``finish`` decides per token."""
    ids, valid = left_pad(prompts)
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    rows = torch.arange(len(prompts))
    step = model.make_step(cache, positions, valid, 0)
    logits = model.forward(ids, step)
    cache.advance(ids.shape[1])
    key_valid, last_pos, all_ids = valid, positions[:, -1], ids
    while True:
        result = sampler.step(logits)
        tokens = result.tokens.tolist()
        flags = zip(result.stopped_eos.tolist(), result.stopped_length.tolist())
        finished: dict[int, str] = {}
        for row, token, (eos, length) in zip(rows.tolist(), tokens, flags):
            reason = finish(row, token, eos, length)
            if reason is not None:
                finished[row] = reason
        top_ids, top_lp = result.top_logprobs or (None, None)
        yield StepEvent(
            rows.tolist(), tokens, finished, logits if keep_logits else None,
            result.logprobs, top_ids, top_lp,
        )  # fmt: skip
        if finished:
            keep = torch.tensor([i for i, r in enumerate(rows.tolist()) if r not in finished])
            if keep.numel() == 0:
                return
            cache.select_rows(keep)
            sampler.select_rows(keep)
            rows, key_valid, last_pos = rows[keep], key_valid[keep], last_pos[keep]
            all_ids, next_ids = all_ids[keep], result.tokens[keep].view(-1, 1)
        else:
            next_ids = result.tokens.view(-1, 1)
        last_pos = last_pos + 1
        key_valid = torch.cat([key_valid, torch.ones(len(rows), 1, dtype=torch.bool)], dim=1)
        all_ids = torch.cat([all_ids, next_ids], dim=1)
        if model.reprefill_at is not None and bool((last_pos == model.reprefill_at).any()):
            # A row crosses LongRoPE's original length: like HF, recompute its keys with the
            # long factors (rows still below keep their short factors, so they are unchanged).
            cache.crop(cache.length)
            positions = (key_valid.long().cumsum(-1) - 1).clamp(min=0)
            logits = model.forward(all_ids, model.make_step(cache, positions, key_valid, 0))
            cache.advance(all_ids.shape[1])
            continue
        step = model.make_step(cache, last_pos.view(-1, 1), key_valid, cache.length)
        logits = model.forward(next_ids, step)
        cache.advance(1)


def score(model: DecoderLM, cache: object, prompts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Logits ``[B, T, V]`` for every position of left-padded prompts (prompt logprobs)."""
    ids, valid = left_pad(prompts)
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    step = model.make_step(cache, positions, valid, 0)
    logits = model.forward(ids, step, all_logits=True)
    cache.advance(ids.shape[1])
    return logits
