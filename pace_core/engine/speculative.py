"""Speculative decoding as a step of the engine core (offline and served alike).

:class:`SpecDecoder` replaces the engine's one-token decode forward. Per scheduler iteration:

1. :meth:`SpecDecoder.draft`: the proposer drafts up to ``k_b`` tokens for every running
   sequence (``k_b`` from :func:`~pace_core.speculative.proposer.draft_budget`: never past
   ``max_tokens`` or the context window), then ONE target forward runs over
   ``[last, d_1 .. d_kb]`` of every row (ragged rows, right-aligned);
2. the engine appends the sequences whose prefill just completed (no drafts: their first token
   comes from the prefill logits) to the batch and its sampler;
3. :meth:`SpecDecoder.verify`: greedy / rejection-sampling verification of every row
   (:func:`~pace_core.speculative.verify.verify_batch`), ``crop`` of the rejected drafts from
   the target's block cache, ``on_accept`` to the proposer (which rolls back its own KV) and
   ``add_rows`` for the new sequences;
4. the engine emits the tokens one at a time (EOS, stop strings and length end a sequence
   inside an accepted run; the rest is dropped), then :meth:`SpecDecoder.commit` appends the
   delivered tokens to the sampler's token state, and finished rows leave with
   :meth:`SpecDecoder.retain` (freeing their draft KV).

The draft model's KV lives in a pool that mirrors the target's (same block size, same number of
blocks). A draft sequence never holds more tokens than its target sequence, and the target
sequence never more than ``prompt + max_tokens - 1``, so the engine's booking of
``prompt + max_tokens`` per sequence covers both pools: no extra booking for the ``k`` draft
positions, no out-of-KV mid-step.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from pace_core.caches.base import BlockKVCache
from pace_core.engine.handle import ModelHandle
from pace_core.sampling.sampler import (
    BatchSampler,
    LogprobEntry,
    compute_logprobs,
    logprob_entries,
)
from pace_core.speculative.inferencer import KVRows, ModelInferencer
from pace_core.speculative.proposer import Proposal, draft_budget, sampling_rows
from pace_core.speculative.verify import align_left, append_ragged, verify_batch

__all__ = ["Drafted", "RowVerdict", "SpecDecoder"]


class Drafted(NamedTuple):
    """The running rows' drafts and the raw left-aligned target logits ``[R, T, V]`` over
    ``[last, d_1 .. d_kb]``."""

    proposal: Proposal
    logits: torch.Tensor


class RowVerdict(NamedTuple):
    """One row's outcome: the tokens to emit (accepted drafts + one target token), how many
    drafts were proposed / accepted, whether the row went through a draft round (False for a
    row whose first token came from its prefill), and its raw logits ``[T, V]`` (position
    ``j`` scored ``tokens[j]``)."""

    tokens: list[int]
    proposed: int
    accepted: int
    speculative: bool
    logits: torch.Tensor


class SpecDecoder:
    """The speculative decode step of one :class:`~pace_core.engine.core.EngineCore`.

    Args:
        model: the target model's handle, loaded with ``spec_config``.
        cache: the engine's target cache (a block pool's geometry sizes the draft pool).
        max_context: tokens a sequence may hold (prompt + generated; None: unbounded).

    Attributes:
        draft_seconds, verify_seconds: wall times of drafting and verifying so far (the
            per-sequence counters travel as ``SpecStep`` events).
    """

    def __init__(self, model: ModelHandle, cache: Any, max_context: int | None) -> None:
        speculator = model.speculator
        if speculator is None:
            raise ValueError("SpecDecoder needs a model loaded with spec_config")
        self.k = speculator.num_speculative_tokens
        self.max_context = max_context
        self.target = ModelInferencer(model.decoder, model.new_cache)
        self.draft_seconds = 0.0
        self.verify_seconds = 0.0
        self._verify_start = 0.0
        self.draft_cache: Any | None = None
        if speculator.draft is not None:
            options = {}
            if isinstance(cache, BlockKVCache):  # a pool like the target's
                capacity = int(cache.num_blocks) * int(cache.block_size)
                options = {"block_size": cache.block_size, "max_tokens": capacity}
            self.draft_cache = speculator.draft.new_cache(**options, memory_gb=None)
        self.proposer = speculator.new_proposer(self.draft_cache)

    def draft(
        self,
        contexts: Sequence[Sequence[int]],
        seq_ids: Sequence[int],
        generated: Sequence[int],
        sampler: BatchSampler,
        cache: Any,
    ) -> Drafted:
        """Propose for the running rows and run the target over ``[last, drafts]``.

        Args:
            contexts: per running row, prompt + generated tokens (the last one is not in the
                target cache yet).
            seq_ids: the rows' sequences in the target ``cache``.
            generated: tokens generated so far per row.
            sampler: the batch sampler; its rows are exactly the running rows.
            cache: the engine's target cache (gains ``1 + drafts`` tokens per row).
        """
        start = time.perf_counter()
        budgets = [
            draft_budget(self.k, cfg.max_new_tokens, n, len(ctx), self.max_context)
            for cfg, n, ctx in zip(sampler.configs, generated, contexts)
        ]
        proposal = self.proposer.propose(contexts, budgets, sampling_rows(sampler))
        self._verify_start = time.perf_counter()
        self.draft_seconds += self._verify_start - start
        queries = [[ctx[-1], *d] for ctx, d in zip(contexts, proposal.tokens)]
        logits = self.target.forward(queries, KVRows(cache, list(seq_ids)), all_logits=True)
        return Drafted(proposal, align_left(logits, [len(q) for q in queries]))

    def verify(
        self,
        sampler: BatchSampler,
        drafted: Drafted | None,
        ready_logits: Sequence[torch.Tensor],
        seq_ids: Sequence[int],
        cache: Any,
    ) -> list[RowVerdict]:
        """Accept drafts for every row of ``sampler`` (the drafted rows, then one row per
        ``ready_logits`` ``[V]`` of a just-prefilled sequence), roll back the target KV of the
        drafted rows (``seq_ids``) and the proposer's, and add the new rows to the proposer."""
        logits, drafts, probs = self._batch(drafted, ready_logits)
        results = verify_batch(sampler, logits, drafts, probs)
        num_drafted = len(seq_ids)
        accepted = [m for _, m in results[:num_drafted]]
        if num_drafted:
            rejected = [len(d) - m for d, m in zip(drafts, accepted)]
            KVRows(cache, list(seq_ids)).crop(rejected)
            self.proposer.on_accept(accepted)
        self.proposer.add_rows(len(ready_logits))
        if num_drafted:
            self.verify_seconds += time.perf_counter() - self._verify_start
        return [
            RowVerdict(tokens, len(drafts[i]), m, i < num_drafted, logits[i])
            for i, (tokens, m) in enumerate(results)
        ]

    @staticmethod
    def _batch(
        drafted: Drafted | None, ready: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, list[list[int]], list[torch.Tensor | None]]:
        """Drafted logits and the ready rows' ``[V]`` logits as one left-aligned batch."""
        parts, drafts, probs = [], [], []
        if drafted is not None:
            parts.append(drafted.logits)
            drafts += drafted.proposal.tokens
            probs += drafted.proposal.probs
        if ready:
            width = drafted.logits.shape[1] if drafted is not None else 1
            first = torch.stack(list(ready))[:, None]
            pad = first.new_zeros(first.shape[0], width - 1, first.shape[2])
            parts.append(torch.cat([first, pad], dim=1) if width > 1 else first)
            drafts += [[] for _ in ready]
            probs += [None] * len(ready)
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        return logits, drafts, probs

    @staticmethod
    def logprobs(logits: torch.Tensor, tokens: Sequence[int], k: int) -> list[LogprobEntry]:
        """Raw-logit logprobs (as the plain engine reports them) of a row's emitted
        ``tokens`` from its left-aligned logits ``[T, V]``: ``(logprob, top ids, top values)``
        per token."""
        res = compute_logprobs(logits[: len(tokens)], torch.tensor(tokens), k)
        top = None if res.top_ids is None else (res.top_ids, res.top_values)
        return logprob_entries(res.chosen, top, [k] * len(tokens))

    @staticmethod
    def commit(sampler: BatchSampler, delivered: Sequence[Sequence[int]]) -> None:
        """Append each row's delivered tokens to the sampler's token state (penalties etc.)."""
        sampler.state = append_ragged(sampler.state, [list(d) for d in delivered])

    def retain(self, rows: Sequence[int]) -> None:
        """Only ``rows`` (indices into the batch) continue; the others' draft KV is freed."""
        self.proposer.retain(list(rows))

    def close(self) -> None:
        """Free every draft sequence."""
        self.proposer.close()
