"""Prompt logprobs: how likely the model found each prompt token, given the ones before it.

One scoring pass per prompt, apart from the generation: the prompt runs through a KV cache of
its own size in chunks of :data:`CHUNK_TOKENS` positions with every position's logits kept, so
at most ``[CHUNK_TOKENS, vocab]`` logits are held at once whatever the prompt's length.
``LLMModel.generate`` (``SamplingConfig.prompt_logprobs``) and the served completions'
``echo`` with ``logprobs`` both read them from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pace_core.engine.output import TokenLogprob
from pace_core.models.decoder import DecoderLM, forward_step

CHUNK_TOKENS = 128
"""Prompt positions scored per forward."""


def score_prompt(
    model: DecoderLM,
    new_cache: Callable[..., Any],
    prompt: torch.Tensor,
    top_k: int,
    chunk_tokens: int = CHUNK_TOKENS,
) -> list[TokenLogprob | None]:
    """``[None]`` (nothing precedes the first token), then per later prompt token its logprob
    and the ``top_k`` most likely tokens at its position (id -> logprob).

    ``new_cache(max_tokens=...)`` makes the pass's cache (an ``LLMModel.new_cache``)."""
    ids = prompt.reshape(-1).to(torch.long)
    n = ids.numel()
    entries: list[TokenLogprob | None] = [None]
    if n < 2:
        return entries
    cache = new_cache(max_tokens=n)
    (seq,) = cache.add_sequences(1)
    try:
        for start in range(0, n - 1, chunk_tokens):
            end = min(n - 1, start + chunk_tokens)  # positions [start, end) predict start+1..end
            rows = ids[start:end].view(1, -1)
            logits = forward_step(model, cache, [seq], rows, [end - start], all_logits=True)[0]
            lp = torch.log_softmax(logits.float(), dim=-1)
            nxt = ids[start + 1 : end + 1]
            chosen = lp.gather(1, nxt.view(-1, 1)).view(-1).tolist()
            tops: list[dict[int, float]] = [{} for _ in chosen]
            if top_k:
                best = lp.topk(top_k, dim=-1)
                tops = [
                    dict(zip(i, v))
                    for i, v in zip(best.indices.tolist(), best.values.tolist(), strict=True)
                ]
            for token, logprob, top in zip(nxt.tolist(), chosen, tops, strict=True):
                entries.append(TokenLogprob(token, logprob, top))
    finally:
        cache.retain([])
    return entries
