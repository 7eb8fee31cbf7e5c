"""Prompt lookup (n-gram) proposer: copy what followed the current suffix earlier on.

For ``n`` from ``max_ngram`` down to ``min_ngram``, the last ``n`` tokens of a row's history are
searched in the history before them; the earliest match wins (as transformers'
``prompt_lookup_num_tokens``: in input-grounded tasks the earliest match is in the prompt),
and the up to ``k`` tokens that followed it are proposed. No model, no state, one-hot ``q``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pace_core.speculative.config import PromptLookupConfig
from pace_core.speculative.proposer import Proposal, RowSampling

__all__ = ["PromptLookupProposer", "lookup"]


def lookup(history: torch.Tensor, k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to ``k`` tokens that followed the earliest earlier occurrence of the longest suffix
    n-gram (``max_ngram >= n >= min_ngram``) of 1-D ``history``; ``[]`` when nothing matches."""
    length = int(history.numel())
    if k <= 0:
        return []
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        pattern = history[length - n :]
        # windows starting at 0 .. length - n - 1 (the suffix itself excluded)
        windows = history[: length - 1].unfold(0, n, 1)
        hits = (windows == pattern).all(dim=1).nonzero()
        if hits.numel():
            start = int(hits[0]) + n
            return history[start : start + k].tolist()
    return []


class PromptLookupProposer:
    """:class:`~pace_core.speculative.proposer.Proposer` backed by :func:`lookup`."""

    def __init__(self, config: PromptLookupConfig) -> None:
        self.config = config

    def propose(
        self,
        contexts: Sequence[Sequence[int]],
        k: Sequence[int],
        sampling: Sequence[RowSampling] | None = None,
    ) -> Proposal:
        cfg = self.config
        tokens = [
            lookup(torch.tensor(ctx, dtype=torch.long), kb, cfg.max_ngram, cfg.min_ngram)
            for ctx, kb in zip(contexts, k)
        ]
        return Proposal.deterministic(tokens)

    def on_accept(self, num_accepted: Sequence[int]) -> None:
        pass

    def retain(self, rows: Sequence[int]) -> None:
        pass

    def add_rows(self, count: int) -> None:
        pass

    def close(self) -> None:
        pass
