"""The speculative generation loop: propose, verify in one target forward, roll back, emit.

It yields the same :class:`~pace_core.engine.generate.StepEvent` stream as the plain
``generation_loop`` (one event per emitted position, in order), so ``LLMModel.generate``,
``stream`` and streamers work unchanged. Per round, for each live row ``b``:

1. budget ``k_b = min(k, tokens left - 1, context room - 1)`` (never overshoots
   ``max_new_tokens`` or the context window: a round emits at most ``k_b + 1`` tokens);
2. the proposer drafts up to ``k_b`` tokens;
3. one target forward over ``[last, d_1 .. d_kb]`` (rows right-aligned, ragged);
4. :func:`~pace_core.speculative.verify.verify_row` accepts ``m_b`` drafts and adds one token;
5. the target cache is cropped by the ``k_b - m_b`` rejected drafts (per row);
6. the emitted tokens go through ``finish`` one at a time: EOS, stop strings and length end
   the row right there and the rest of its run is dropped; finished rows leave the batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from pace_core.engine.generate import FinishFn, StepEvent
from pace_core.sampling.sampler import BatchSampler, compute_logprobs
from pace_core.speculative.inferencer import KVRows, ModelInferencer
from pace_core.speculative.proposer import (
    Proposal,
    Proposer,
    RowSampling,
    draft_budget,
    sampling_rows,
)
from pace_core.speculative.stats import SpecStats
from pace_core.speculative.verify import (
    align_left,
    append_ragged,
    check_speculable,
    stop_flags,
    verify_batch,
)

__all__ = ["SpeculativeRun"]


class SpeculativeRun:
    """One batch of speculative generation; iterate it for the :class:`StepEvent` stream.

    Args:
        target: the target model's inferencer.
        proposer: drafts tokens for this batch (closed when the run ends).
        num_speculative_tokens: ``k``, the most drafts per row and round.
        prompts: unpadded 1-D prompt tensors.
        sampler: the batch's :class:`BatchSampler` (configs, processors, state, generators).
        finish: ``(row, token, hit_eos, hit_length) -> reason | None`` per emitted token.
        keep_logits: put raw logits into the events.
        on_round_end: test/diagnostic hook called after each round's bookkeeping.
        on_done: called with :attr:`stats` when the run ends (e.g. to sum lifetime stats).

    Attributes:
        row_stats: :class:`SpecStats` per original row.
        stats: batch totals (with draft / verify wall times).
        kv: the target's :class:`KVRows` while running (row ``i`` = ``rows[i]``).
        rows, histories: live original row indices; full token history per original row.
    """

    def __init__(
        self,
        target: ModelInferencer,
        proposer: Proposer,
        num_speculative_tokens: int,
        prompts: Sequence[torch.Tensor],
        sampler: BatchSampler,
        finish: FinishFn,
        *,
        keep_logits: bool = False,
        on_round_end: Callable[[SpeculativeRun], None] | None = None,
        on_done: Callable[[SpecStats], Any] | None = None,
    ) -> None:
        check_speculable(sampler)
        self.target, self.proposer, self.k = target, proposer, num_speculative_tokens
        self.prompts, self.sampler, self.finish = list(prompts), sampler, finish
        self.keep_logits, self.on_round_end, self.on_done = keep_logits, on_round_end, on_done
        self.row_stats = [SpecStats() for _ in self.prompts]
        self.stats = SpecStats()
        self.kv: KVRows | None = None
        self.rows: list[int] = []
        self.histories = [p.tolist() for p in self.prompts]
        self.num_generated = [0] * len(self.prompts)

    def __iter__(self) -> Iterator[StepEvent]:
        return self._run()

    # -- the loop --------------------------------------------------------------------------
    @torch.inference_mode()
    def _run(self) -> Iterator[StepEvent]:
        if not self.prompts:
            return
        self.rows = list(range(len(self.prompts)))
        self.kv = self.target.new_kv(len(self.prompts))
        try:
            logits = self.target.forward(self.prompts, self.kv, all_logits=False)
            empty = Proposal.deterministic([[] for _ in self.rows])
            yield from self._verify_and_emit(logits[:, None], empty, speculative=False)
            while self.rows:
                start = time.perf_counter()
                contexts = [self.histories[r] for r in self.rows]
                proposal = self.proposer.propose(contexts, self._budgets(), self._sampling())
                mid = time.perf_counter()
                queries = [[ctx[-1], *d] for ctx, d in zip(contexts, proposal.tokens)]
                logits = self.target.forward(queries, self.kv, all_logits=True)
                logits = align_left(logits, [len(q) for q in queries])
                self.stats.draft_seconds += mid - start
                yield from self._verify_and_emit(logits, proposal, speculative=True, t0=mid)
        finally:
            if self.kv is not None:
                self.kv.release()
            self.proposer.close()
            if self.on_done is not None:
                self.on_done(self.stats)

    def _budgets(self) -> list[int]:
        limit = self.target.max_positions
        cfgs = self.sampler.configs
        return [
            draft_budget(
                self.k, cfgs[i].max_new_tokens, self.num_generated[r], len(self.histories[r]), limit
            )
            for i, r in enumerate(self.rows)
        ]

    def _sampling(self) -> list[RowSampling]:
        return sampling_rows(self.sampler)

    def _verify_and_emit(
        self, logits: torch.Tensor, proposal: Proposal, *, speculative: bool, t0: float = 0.0
    ) -> Iterator[StepEvent]:
        """Accept drafts, roll back, then emit position by position; ``logits`` left-aligned."""
        drafts = proposal.tokens
        results = verify_batch(self.sampler, logits, drafts, proposal.probs)
        accepted = [m for _, m in results]
        if speculative:
            self.kv.crop([len(d) - m for d, m in zip(drafts, accepted)])
            self.proposer.on_accept(accepted)
            self.stats.verify_seconds += time.perf_counter() - t0
        delivered, finished = yield from self._emit(logits, [e for e, _ in results])
        if speculative:
            for i, r in enumerate(self.rows):
                for st in (self.row_stats[r], self.stats):
                    st.record(len(drafts[i]), accepted[i], len(delivered[i]))
        self._commit(delivered, finished)

    def _emit(self, logits: torch.Tensor, emitted: list[list[int]]) -> Iterator[StepEvent]:
        """One event per position; ``finish`` may end a row mid-run (the rest is dropped)."""
        delivered: list[list[int]] = [[] for _ in emitted]
        finished: set[int] = set()
        cfgs = self.sampler.configs
        for j in range(max(len(e) for e in emitted)):
            idx = [i for i, e in enumerate(emitted) if j < len(e) and i not in finished]
            if not idx:
                break
            tokens = [emitted[i][j] for i in idx]
            reasons: dict[int, str] = {}
            for i, token in zip(idx, tokens):
                r = self.rows[i]
                self.num_generated[r] += 1
                delivered[i].append(token)
                eos, length = stop_flags(cfgs[i], token, self.num_generated[r])
                reason = self.finish(r, token, eos, length)
                if reason is None and length:
                    reason = "length"  # never run past max_new_tokens
                if reason is not None:
                    finished.add(i)
                    reasons[r] = reason
            raw = logits[idx, j]
            yield StepEvent(
                [self.rows[i] for i in idx],
                tokens,
                reasons,
                raw if self.keep_logits else None,
                *self._logprobs(idx, raw, tokens),
            )
        return delivered, finished

    def _logprobs(self, idx: list[int], raw: torch.Tensor, tokens: list[int]) -> tuple[Any, ...]:
        wanted = [self.sampler.configs[i].logprobs for i in idx]
        if all(w is None for w in wanted):
            return None, None, None
        k = max(w or 0 for w in wanted)
        res = compute_logprobs(raw, torch.tensor(tokens), k)
        return res.chosen, res.top_ids, res.top_values

    def _commit(self, delivered: list[list[int]], finished: set[int]) -> None:
        """Record delivered tokens in histories and sampler state; drop finished rows."""
        for i, r in enumerate(self.rows):
            self.histories[r].extend(delivered[i])
        self.sampler.state = append_ragged(self.sampler.state, delivered)
        if finished:
            keep = [i for i in range(len(self.rows)) if i not in finished]
            self.rows = [self.rows[i] for i in keep]
            if keep:
                self.kv.retain(keep)
                self.sampler.select_rows(torch.tensor(keep))
                self.proposer.retain(keep)
        if self.on_round_end is not None:
            self.on_round_end(self)
