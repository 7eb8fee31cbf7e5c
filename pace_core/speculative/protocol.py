"""Typed protocols of speculative decoding, after the ``naive_speculate.infer`` interface.

An :class:`Inferencer` runs a model over *query* tokens on top of a KV cache that already
holds everything before them, and samples new tokens:

* :meth:`Inferencer.prefill` processes the query tokens in one forward (a prompt, or a
  verification block ``[last token, draft_1..draft_k]``) and returns the logits of every query
  position plus one sampled token per row;
* :meth:`Inferencer.decode` generates autoregressively from a ``[B, 1]`` query.

Both add the KV of the query tokens to the cache (never of the returned new tokens), so a
caller can roll back with :meth:`SequenceKV.crop`. pace's caches hold many sequences, so the
``kv_cache`` argument is a :class:`SequenceKV`: a batch of sequences of one cache
(:class:`pace_core.speculative.inferencer.KVRows`). ``sample_strategy`` is a
:class:`TokenSampler` (pace's :class:`~pace_core.sampling.sampler.BatchSampler`, which applies
the request's logits processors with a per-row seeded generator) or ``None`` for greedy argmax
of the raw logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch

__all__ = [
    "DecodeOutput",
    "Inferencer",
    "PrefillOutput",
    "SequenceKV",
    "TokenSampler",
]


class PrefillOutput(NamedTuple):
    """Result of :meth:`Inferencer.prefill`.

    Attributes:
        token_ids: the sampled next token per row, long ``[B, 1]``.
        token_logits: raw logits at every query position, float ``[B, T, V]`` (position ``t``
            predicts the token after query token ``t``; rows are right-aligned when the query
            rows have different lengths, pad positions hold meaningless values).
    """

    token_ids: torch.Tensor
    token_logits: torch.Tensor


class DecodeOutput(NamedTuple):
    """Result of :meth:`Inferencer.decode`.

    Attributes:
        token_ids: the generated tokens, long ``[B, n]`` (``n <= max_new_tokens``).
        token_logits: the raw logits each token was sampled from, float ``[B, n, V]``.
    """

    token_ids: torch.Tensor
    token_logits: torch.Tensor


@runtime_checkable
class SequenceKV(Protocol):
    """A batch of sequences in a KV cache (the ``kv_cache`` of an :class:`Inferencer`)."""

    def crop(self, num_tokens: int | Sequence[int]) -> None:
        """Drop the latest ``num_tokens`` tokens of every row (or ``num_tokens[b]`` of row b)."""
        ...

    def get_num_tokens(self) -> list[int]:
        """Tokens held per row."""
        ...


@runtime_checkable
class TokenSampler(Protocol):
    """Picks one token per row from ``[B, V]`` logits and remembers it (processor state).

    :class:`~pace_core.sampling.sampler.BatchSampler` is the implementation; its
    ``StepResult`` has ``tokens [B]`` and ``finished [B]`` (EOS or max_new_tokens).
    """

    def step(self, logits: torch.Tensor) -> Any: ...


@runtime_checkable
class Inferencer(Protocol):
    """Processes token sequences with a KV-cached model and generates new tokens."""

    def prefill(
        self,
        query_token_ids: torch.Tensor | Sequence[Sequence[int] | torch.Tensor],
        kv_cache: SequenceKV,
        sample_strategy: TokenSampler | None,
    ) -> PrefillOutput:
        """Process the query tokens in parallel and sample the next token of each row.

        ``kv_cache`` must hold every token before the query; it gains the query's KV.

        Args:
            query_token_ids: ``[B, T]`` ids, or one 1-D id sequence per row (ragged rows are
                right-aligned internally).
            kv_cache: the rows' sequences.
            sample_strategy: a :class:`TokenSampler`, or ``None`` for greedy argmax.
        """
        ...

    def decode(
        self,
        query_token_ids: torch.Tensor,
        kv_cache: SequenceKV,
        max_new_tokens: int,
        sample_strategy: TokenSampler | None,
    ) -> DecodeOutput:
        """Generate up to ``max_new_tokens`` tokens autoregressively from a ``[B, 1]`` query.

        Stops early once every row has finished (the sampler's EOS / length flags). The cache
        gains the query and every generated token except the last one.
        """
        ...
