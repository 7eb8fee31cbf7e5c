"""The proposer interface: who drafts the tokens the target verifies.

A proposer serves one batch: one ``generate`` call, or the changing batch of a server's
continuous batching. Each round the engine calls :meth:`Proposer.propose` with the full token
history of every live row (prompt + generated) and a per-row budget ``k[b]``
(:func:`draft_budget`); after verification it calls :meth:`Proposer.on_accept` with the number
of draft tokens the target accepted per row, :meth:`Proposer.retain` when rows finish and, between
rounds, :meth:`Proposer.add_rows` when new rows join at the end. Model-based proposers keep
their own KV cache and roll it back in those hooks.

For sampling rows a proposer that *samples* its drafts returns the distribution ``q`` each
draft token was drawn from (:attr:`Proposal.probs`); rejection sampling needs it. A
deterministic proposer (prompt lookup, greedy drafts) returns ``None``: ``q`` is one-hot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from pace_core.sampling.argmax import greedy_argmax
from pace_core.sampling.sampler import sample_from_logits

__all__ = [
    "Proposal",
    "Proposer",
    "RowSampling",
    "choose_drafts",
    "draft_budget",
    "sampling_rows",
]


@dataclass(frozen=True)
class RowSampling:
    """How a row draws draft tokens: greedy argmax, or from ``softmax(logits / temperature)``
    with the request's own generator (the global RNG is never used)."""

    greedy: bool = True
    temperature: float = 1.0
    generator: torch.Generator | None = None


GREEDY = RowSampling()


def sampling_rows(sampler: Any) -> list[RowSampling]:
    """How each row of a :class:`~pace_core.sampling.sampler.BatchSampler` draws its drafts."""
    return [
        RowSampling(cfg.is_greedy, cfg.temperature, gen)
        for cfg, gen in zip(sampler.configs, sampler.generators)
    ]


def draft_budget(
    k: int, max_new_tokens: int, generated: int, history_len: int, limit: int | None
) -> int:
    """Drafts a row may get this round: at most ``k``, and few enough that the round's
    ``drafts + 1`` emitted tokens stay within ``max_new_tokens`` and the context ``limit``.

    So a verification forward never takes a sequence's KV past ``prompt + max_new_tokens - 1``
    (or ``limit - 1``) tokens: a server's KV booking of ``prompt + max_tokens`` covers it.
    """
    budget = min(k, max_new_tokens - generated - 1)
    if limit is not None:
        budget = min(budget, limit - history_len - 1)
    return max(0, budget)


@dataclass
class Proposal:
    """Draft tokens per row (``tokens[b]`` has at most ``k[b]`` ids) and, for rows whose drafts
    were sampled, the float32 ``[len(tokens[b]), V]`` probabilities they were drawn from."""

    tokens: list[list[int]]
    probs: list[torch.Tensor | None]

    @classmethod
    def deterministic(cls, tokens: list[list[int]]) -> Proposal:
        return cls(tokens, [None] * len(tokens))


@runtime_checkable
class Proposer(Protocol):
    """Drafts tokens for the live rows of one batch (see the module doc)."""

    def propose(
        self,
        contexts: Sequence[Sequence[int]],
        k: Sequence[int],
        sampling: Sequence[RowSampling] | None = None,
    ) -> Proposal:
        """Up to ``k[b]`` draft tokens following ``contexts[b]`` for each live row ``b``."""
        ...

    def on_accept(self, num_accepted: Sequence[int]) -> None:
        """The target accepted the first ``num_accepted[b]`` draft tokens of row ``b``."""
        ...

    def retain(self, rows: Sequence[int]) -> None:
        """Only ``rows`` (indices into the current live rows, in order) continue."""
        ...

    def add_rows(self, count: int) -> None:
        """``count`` new rows join after the live ones (between rounds; their history arrives
        with the next :meth:`propose`)."""
        ...

    def close(self) -> None:
        """The batch is done: free any state."""
        ...


def choose_drafts(
    logits: torch.Tensor, sampling: Sequence[RowSampling]
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """One draft token per row from raw draft ``logits [B, V]``: greedy rows take the argmax,
    sampling rows draw from ``softmax(logits / T)``; returns the tokens and each sampling row's
    ``q`` (float32 ``[V]``; ``None`` for greedy rows)."""
    tokens = greedy_argmax(logits)
    probs: list[torch.Tensor | None] = [None] * logits.shape[0]
    for b, s in enumerate(sampling):
        if s.greedy or s.generator is None:
            continue
        x = logits[b : b + 1].float() / s.temperature
        probs[b] = torch.softmax(x[0], dim=-1)
        tokens[b] = sample_from_logits(x, [s.generator])[0]
    return tokens, probs
