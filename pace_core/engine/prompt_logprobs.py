"""Prompt logprobs: how likely the model found each prompt token, given the ones before it.

Scored in the sequence's own prefill, one pass: the forwards that prefill its prompt chunks
keep every position's hidden state (as embeddings' chunks do) and :class:`PromptScorer` turns
each chunk's positions into logits :data:`CHUNK_TOKENS` at a time (so at most ``[CHUNK_TOKENS,
vocab]`` logits are held at once, whatever the chunk), each scoring the next prompt token. Such
a sequence adopts no cached prefix: every position's logits are needed.
``LLMModel.generate`` (``SamplingConfig.prompt_logprobs``) and the served completions' ``echo``
with ``logprobs`` both read them from here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pace_core.engine.output import TokenLogprob

CHUNK_TOKENS = 128
"""Positions whose logits exist at once."""


class PromptScorer:
    """One sequence's prompt logprobs, filled chunk by chunk as its prompt is prefilled.

    ``entries``: ``[None]`` (nothing precedes the first token), then per later prompt token its
    logprob and the ``top_k`` most likely tokens at its position (id -> logprob).
    """

    def __init__(self, prompt: torch.Tensor, top_k: int, chunk_tokens: int = CHUNK_TOKENS):
        self.ids = prompt.reshape(-1).to(torch.long)
        self.top_k = top_k
        self.chunk_tokens = chunk_tokens
        self.entries: list[TokenLogprob | None] = [None]

    def add(
        self, head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, start: int
    ) -> None:
        """The hidden states ``[n, H]`` of prompt positions ``start .. start + n - 1``; ``head``
        maps ``[1, T, H]`` to logits ``[1, T, V]``. Each position scores the next prompt token
        (the prompt's last position has none to score)."""
        n = min(hidden.shape[0], self.ids.numel() - 1 - start)
        for s in range(0, n, self.chunk_tokens):
            e = min(n, s + self.chunk_tokens)
            self._score(head(hidden[s:e].unsqueeze(0))[0], start + s)

    def _score(self, logits: torch.Tensor, first: int) -> None:
        """Logits ``[T, V]`` of positions ``first ..``, scoring tokens ``first + 1 ..``."""
        lp = torch.log_softmax(logits.float(), dim=-1)
        nxt = self.ids[first + 1 : first + 1 + lp.shape[0]]
        chosen = lp.gather(1, nxt.view(-1, 1)).view(-1).tolist()
        tops: list[dict[int, float]] = [{} for _ in chosen]
        if self.top_k:
            best = lp.topk(self.top_k, dim=-1)
            pairs = zip(best.indices.tolist(), best.values.tolist(), strict=True)
            tops = [dict(zip(i, v, strict=True)) for i, v in pairs]
        for token, logprob, top in zip(nxt.tolist(), chosen, tops, strict=True):
            self.entries.append(TokenLogprob(token, logprob, top))
