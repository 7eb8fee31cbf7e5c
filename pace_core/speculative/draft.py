"""Classic draft-model proposer: ``k`` autoregressive steps of a small model.

The draft keeps its own KV cache (same cache type as the target). Per row it remembers which
tokens its cache holds (:attr:`ModelProposer.held`). After verification :meth:`on_accept`
crops the rejected drafts, so the cache holds only accepted history; each round then feeds
the tokens it has not seen (the target's last token, maybe the last accepted draft) and drafts
``k`` tokens. A consistency check against the history at every round crops anything else.

A row whose draft cache is far behind (a new row: its whole prompt) first catches up in a
forward of its own, so one long prompt does not pad the batched draft forward of every row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pace_core.speculative.inferencer import KVRows, ModelInferencer
from pace_core.speculative.proposer import GREEDY, Proposal, RowSampling, choose_drafts

__all__ = ["DraftModelProposer", "ModelProposer"]


CATCH_UP = 2
"""A row missing more tokens than this is caught up in a separate draft forward."""


class ModelProposer:
    """Shared KV bookkeeping of model-based proposers (classic draft, PARD).

    ``cache``: an empty draft KV cache to hold the rows (default: a new cache of the draft
    model's own type and budget, made at the first round).
    """

    def __init__(self, inferencer: ModelInferencer, cache: Any | None = None) -> None:
        self.inferencer = inferencer
        self.cache = cache
        self.kv: KVRows | None = None
        self.held: list[list[int]] = []  # per row: the tokens whose KV the draft cache holds
        self._base: list[int] = []  # per row: len(held) before this round's drafts were fed
        self._valid: list[int] = []  # per row: held[:n] is known to match the history

    def _sync(self, contexts: Sequence[Sequence[int]]) -> list[list[int]]:
        """Crop cached tokens that left the history; return each row's missing suffix."""
        if self.kv is None:
            self.add_rows(len(contexts))
        if len(self.held) != len(contexts):
            raise ValueError(f"{len(contexts)} contexts for {len(self.held)} draft rows")
        crops, suffixes = [], []
        for b, ctx in enumerate(contexts):
            held = self.held[b]
            limit = min(len(held), len(ctx) - 1)  # re-feed >= 1 token: its logits draft next
            n = min(self._valid[b], limit)
            while n < limit and held[n] == ctx[n]:
                n += 1
            crops.append(len(held) - n)
            del held[n:]
            suffixes.append(list(ctx[n:]))
            self._valid[b] = len(ctx)
        self.kv.crop(crops)
        return self._catch_up(suffixes)

    def _catch_up(self, suffixes: list[list[int]]) -> list[list[int]]:
        """Feed all but the last token of long suffixes in a forward of those rows only."""
        behind = [b for b, s in enumerate(suffixes) if len(s) > CATCH_UP]
        if not behind:
            return suffixes
        rows = KVRows(self.kv.cache, [self.kv.seq_ids[b] for b in behind])
        self.inferencer.forward([suffixes[b][:-1] for b in behind], rows, all_logits=False)
        for b in behind:
            self.held[b].extend(suffixes[b][:-1])
            suffixes[b] = suffixes[b][-1:]
        return suffixes

    def add_rows(self, count: int) -> None:
        """``count`` new, empty rows after the current ones (between rounds)."""
        if self.kv is None:
            cache = self.cache if self.cache is not None else self.inferencer.new_cache()
            self.kv = KVRows(cache, [])
        self.kv.extend(count)
        self.held += [[] for _ in range(count)]
        self._valid += [0] * count
        if self._base:
            self._base += [0] * count

    def _start_round(
        self,
        contexts: Sequence[Sequence[int]],
        k: Sequence[int],
        sampling: Sequence[RowSampling] | None,
        extra: int,
    ) -> tuple[list[list[int]], list[int], list[RowSampling]]:
        """Sync the draft cache with ``contexts``; return each row's unseen suffix, ``k``
        capped so the draft (``extra`` positions past its drafts) stays in its context
        window, and the per-row sampling (greedy by default)."""
        suffixes = self._sync(contexts)
        limit = self.inferencer.max_positions
        if limit is not None:
            k = [max(0, min(kb, limit - len(ctx) - extra)) for ctx, kb in zip(contexts, k)]
        rows = list(sampling) if sampling is not None else [GREEDY] * len(contexts)
        return suffixes, list(k), rows

    def _mark(self) -> None:
        """Remember where this round's draft tokens start in ``held``."""
        self._base = [len(h) for h in self.held]

    def on_accept(self, num_accepted: Sequence[int]) -> None:
        """Crop the draft KV of rejected draft tokens."""
        if self.kv is None or not self._base:
            return
        crops = []
        for held, base, m in zip(self.held, self._base, num_accepted):
            n = max(0, len(held) - (base + m))
            del held[len(held) - n :]
            crops.append(n)
        self.kv.crop(crops)
        self._base = []

    def retain(self, rows: Sequence[int]) -> None:
        if self.kv is not None:
            self.kv.retain(rows)
            self.held = [self.held[r] for r in rows]
            self._valid = [self._valid[r] for r in rows]
            self._base = [self._base[r] for r in rows] if self._base else []

    def close(self) -> None:
        if self.kv is not None:
            self.kv.release()
            self.kv = None
        self.held, self._valid, self._base = [], [], []


class DraftModelProposer(ModelProposer):
    """Drafts with ``max(k)`` batched autoregressive steps of the draft model."""

    def propose(
        self,
        contexts: Sequence[Sequence[int]],
        k: Sequence[int],
        sampling: Sequence[RowSampling] | None = None,
    ) -> Proposal:
        suffixes, k, sampling = self._start_round(contexts, k, sampling, 1)
        steps = max(k, default=0)
        b = len(contexts)
        if steps == 0:
            return Proposal.deterministic([[] for _ in range(b)])
        kv = self.kv
        logits = self.inferencer.forward(suffixes, kv, all_logits=False)
        for row, s in zip(self.held, suffixes):
            row.extend(s)
        self._mark()
        drafted: list[torch.Tensor] = []
        probs: list[list[torch.Tensor | None]] = []
        for step in range(steps):
            tokens, q = choose_drafts(logits, sampling)
            drafted.append(tokens)
            probs.append(q)
            if step + 1 < steps:
                logits = self.inferencer.forward(tokens.view(-1, 1), kv, all_logits=False)
                for row, t in zip(self.held, tokens.tolist()):
                    row.append(t)
        ids = torch.stack(drafted, dim=1).tolist()
        out_tokens = [ids[i][: k[i]] for i in range(b)]
        out_probs: list[torch.Tensor | None] = []
        for i in range(b):
            rows = [probs[j][i] for j in range(k[i])]
            sampled = k[i] > 0 and rows[0] is not None
            out_probs.append(torch.stack(rows) if sampled else None)  # type: ignore[arg-type]
        return Proposal(out_tokens, out_probs)
