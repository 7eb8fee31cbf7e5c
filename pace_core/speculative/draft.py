"""Classic draft-model proposer: ``k`` autoregressive steps of a small model.

The draft keeps its own KV cache (same cache type as the target). Per row it remembers which
tokens its cache holds (:attr:`ModelProposer.held`); each round it crops whatever disagrees
with the row's history (rejected drafts), feeds the missing suffix and drafts ``k`` tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pace_core.speculative.inferencer import KVRows, ModelInferencer
from pace_core.speculative.proposer import GREEDY, Proposal, RowSampling, choose_drafts

__all__ = ["DraftModelProposer", "ModelProposer"]


class ModelProposer:
    """Shared KV bookkeeping of model-based proposers (classic draft, PARD)."""

    def __init__(self, inferencer: ModelInferencer) -> None:
        self.inferencer = inferencer
        self.kv: KVRows | None = None
        self.held: list[list[int]] = []  # per row: the tokens whose KV the draft cache holds

    def _sync(self, contexts: Sequence[Sequence[int]]) -> list[list[int]]:
        """Crop cached tokens that left the history; return each row's missing suffix."""
        if self.kv is None:
            self.kv = self.inferencer.new_kv(len(contexts))
            self.held = [[] for _ in contexts]
        crops, suffixes = [], []
        for b, ctx in enumerate(contexts):
            held = self.held[b]
            n = 0
            limit = min(len(held), len(ctx) - 1)  # re-feed >= 1 token: its logits draft next
            while n < limit and held[n] == ctx[n]:
                n += 1
            crops.append(len(held) - n)
            del held[n:]
            suffixes.append(list(ctx[n:]))
        self.kv.crop(crops)
        return suffixes

    def _room(self, contexts: Sequence[Sequence[int]], k: Sequence[int], extra: int) -> list[int]:
        """``k`` capped so the draft never runs past its own context window."""
        limit = self.inferencer.max_positions
        if limit is None:
            return list(k)
        return [max(0, min(kb, limit - len(ctx) - extra)) for ctx, kb in zip(contexts, k)]

    def on_accept(self, num_accepted: Sequence[int]) -> None:
        pass  # rejected drafts are cropped lazily by _sync (their ids are in ``held``)

    def retain(self, rows: Sequence[int]) -> None:
        if self.kv is not None:
            self.kv.retain(rows)
            self.held = [self.held[r] for r in rows]

    def close(self) -> None:
        if self.kv is not None:
            self.kv.release()
            self.kv = None
        self.held = []


class DraftModelProposer(ModelProposer):
    """Drafts with ``max(k)`` batched autoregressive steps of the draft model."""

    def propose(
        self,
        contexts: Sequence[Sequence[int]],
        k: Sequence[int],
        sampling: Sequence[RowSampling] | None = None,
    ) -> Proposal:
        sampling = list(sampling) if sampling is not None else [GREEDY] * len(contexts)
        suffixes = self._sync(contexts)
        k = self._room(contexts, k, 1)
        steps = max(k, default=0)
        b = len(contexts)
        if steps == 0:
            return Proposal.deterministic([[] for _ in range(b)])
        kv = self.kv
        logits = self.inferencer.forward(suffixes, kv, all_logits=False)
        for row, s in zip(self.held, suffixes):
            row.extend(s)
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
