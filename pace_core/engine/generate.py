"""The batched generation loop: prefill, then one decode forward per step for live rows.

Prompts of different lengths are prefilled together with left padding in the query; the KV
cache stores only real tokens. Finished rows leave the batch at once (their cache space is
freed), so they stop costing compute. The loop yields a :class:`StepEvent` per step;
``LLMModel`` builds outputs, streams and iterators on top of it.
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


def forward_step(
    model: DecoderLM,
    cache: object,
    seq_ids: list[int],
    ids: torch.Tensor,
    num_new: Sequence[int],
    *,
    all_logits: bool = False,
) -> torch.Tensor:
    """One forward pass adding ``num_new[b]`` real (right-aligned) tokens of ``ids`` per row."""
    meta = cache.begin_step(seq_ids, list(num_new), ids.shape[1])
    logits = model.forward(ids, model.make_step(cache, meta), all_logits=all_logits)
    cache.end_step()
    return logits


def prefill(
    model: DecoderLM,
    cache: object,
    seq_ids: list[int],
    prompts: Sequence[torch.Tensor],
    *,
    all_logits: bool = False,
) -> torch.Tensor:
    ids, _ = left_pad(prompts)
    return forward_step(
        model, cache, seq_ids, ids, [p.numel() for p in prompts], all_logits=all_logits
    )


def generation_loop(
    model: DecoderLM,
    cache: object,
    prompts: Sequence[torch.Tensor],
    sampler: object,
    finish: FinishFn,
    *,
    keep_logits: bool = False,
    first_prefill: Callable[..., torch.Tensor] | None = None,
    reserve: int = 0,
) -> Iterator[StepEvent]:
    """Run prefill and decode until every row has finished; ``finish`` decides per token.
    ``first_prefill(model, cache, seq_ids, prompts)`` replaces :func:`prefill` for the
    prompts (e.g. :func:`~pace_core.engine.shared_prefill.prefill_sharing`); a cache with
    ``reserve(tokens)`` (the contiguous ones) makes room for ``reserve`` tokens per row up
    front. The sequences leave the cache when the loop ends, also when it is abandoned or
    fails."""
    seq_ids = cache.add_sequences(len(prompts))
    if reserve and hasattr(cache, "reserve"):
        cache.reserve(reserve)
    try:
        yield from _loop(
            model, cache, seq_ids, prompts, sampler, finish, keep_logits,
            first_prefill or prefill,
        )  # fmt: skip
    finally:
        cache.retain([])


def _loop(
    model: DecoderLM,
    cache: object,
    seq_ids: list[int],
    prompts: Sequence[torch.Tensor],
    sampler: object,
    finish: FinishFn,
    keep_logits: bool,
    first_prefill: Callable[..., torch.Tensor],
) -> Iterator[StepEvent]:
    rows = list(range(len(prompts)))
    histories = [p.clone() for p in prompts]  # only needed for LongRoPE re-prefill
    logits = first_prefill(model, cache, seq_ids, prompts)
    while True:
        result = sampler.step(logits)
        tokens = result.tokens.tolist()
        flags = zip(result.stopped_eos.tolist(), result.stopped_length.tolist())
        finished: dict[int, str] = {}
        for row, token, (eos, length) in zip(rows, tokens, flags):
            reason = finish(row, token, eos, length)
            if reason is not None:
                finished[row] = reason
        top_ids, top_lp = result.top_logprobs or (None, None)
        yield StepEvent(
            list(rows),
            tokens,
            finished,
            logits if keep_logits else None,
            result.logprobs,
            top_ids,
            top_lp,
        )
        next_ids = result.tokens
        if finished:
            keep = [i for i, r in enumerate(rows) if r not in finished]
            if not keep:
                return
            seq_ids = cache.retain([seq_ids[i] for i in keep])
            sampler.select_rows(torch.tensor(keep))
            rows = [rows[i] for i in keep]
            next_ids = next_ids[torch.tensor(keep)]
        if model.reprefill_at is not None:
            for i, r in enumerate(rows):
                histories[r] = torch.cat([histories[r], next_ids[i : i + 1]])
            if any(cache.get_num_tokens(s) == model.reprefill_at for s in seq_ids):
                # A row crosses LongRoPE's original length: like HF, recompute its keys with the
                # long factors (rows still below keep their short factors, so they are unchanged).
                for s in seq_ids:
                    cache.crop(s, cache.get_num_tokens(s))
                logits = prefill(model, cache, seq_ids, [histories[r] for r in rows])
                continue
        logits = forward_step(model, cache, seq_ids, next_ids.view(-1, 1), [1] * len(rows))


def score(model: DecoderLM, cache: object, prompts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Logits ``[B, T, V]`` for every position of left-padded prompts (prompt logprobs)."""
    seq_ids = cache.add_sequences(len(prompts))
    logits = prefill(model, cache, seq_ids, prompts, all_logits=True)
    cache.retain([])
    return logits
