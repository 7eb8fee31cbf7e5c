"""The model runner: one step's rows in, logits out.

A step is the running sequences' next inputs (one token each; a LongRoPE sequence crossing its
original length re-enters with its whole history) and this step's prompt chunks. When the
model's decoder stack packs ragged steps (``DecoderLM.packs_ragged_steps``: no padding
computed, the weights read once) or the cache steps all its rows together (a contiguous
cache), they run as ONE forward; else the chunks run as forwards of their own, grouped by
length, and the decodes as one batched forward. Forwards that prefill feed the
:class:`~pace_core.engine.prefill_budget.PrefillBudget` its rate; a forward with chunks of
embeddings in it keeps every position's hidden state and feeds each embedding's
:class:`~pace_core.models.embedding.PoolState`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, TypeVar

import torch

from pace_core.engine.prefill_budget import PrefillBudget
from pace_core.engine.scheduler import Request
from pace_core.models.decoder import DecoderLM, forward_step, hidden_step

T = TypeVar("T")


def step_batch(rows: Sequence[int | torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """The ids of one forward, a row per entry: a decode's one token (an ``int``) or a 1-D
    token tensor (a prompt chunk, a recomputed history), right-aligned in ``[B, W]`` (W = the
    longest row), and the token count of each row."""
    counts = [1 if isinstance(r, int) else int(r.numel()) for r in rows]
    batch = torch.zeros(len(rows), max(counts), dtype=torch.long)
    singles = [i for i, r in enumerate(rows) if isinstance(r, int)]
    if singles:
        batch[singles, -1] = torch.tensor([rows[i] for i in singles], dtype=torch.long)
    for i, r in enumerate(rows):
        if not isinstance(r, int):
            batch[i, batch.shape[1] - counts[i] :] = r
    return batch, counts


def group_chunks(chunks: list[tuple[T, int]]) -> list[list[tuple[T, int]]]:
    """Batch prefill chunks into forwards with at most ~25% padding (rows are left-padded)."""
    groups: list[list[tuple[T, int]]] = []
    real = 0
    for item in sorted(chunks, key=lambda c: -c[1]):
        if groups:
            g = groups[-1]
            width = g[0][1]
            if (len(g) + 1) * width <= 1.25 * (real + item[1]):
                g.append(item)
                real += item[1]
                continue
        groups.append([item])
        real = item[1]
    return groups


class ModelRunner:
    """Runs the forwards of the core's steps on one decoder and cache.

    Args:
        model: the decoder.
        budget: the prefill budget whose rate prefill forwards measure.
        one_forward: decodes and prompt chunks share one forward (see the module doc).
    """

    def __init__(self, model: DecoderLM, budget: PrefillBudget, one_forward: bool) -> None:
        self.model = model
        self.budget = budget
        self.one_forward = one_forward
        self.reprefill_at = model.reprefill_at

    def forward(
        self, cache: Any, seq_ids: list[int], rows: Sequence[int | torch.Tensor]
    ) -> torch.Tensor:
        """One forward adding ``rows[b]`` to sequence ``seq_ids[b]``; logits ``[B, V]`` of each
        row's last token."""
        ids, counts = step_batch(rows)
        return forward_step(self.model, cache, seq_ids, ids, counts)

    def _decode_input(self, cache: Any, req: Request) -> int | torch.Tensor:
        """A running sequence's next input: its last token, or (LongRoPE, like HF) its whole
        history once its cache reaches the original context length: the keys are then
        recomputed with the long factors (its cache is emptied first)."""
        if self.reprefill_at is not None and cache.get_num_tokens(req.seq_id) == self.reprefill_at:
            cache.crop(req.seq_id, self.reprefill_at)
            return torch.cat([req.prompt, torch.tensor(req.tokens, dtype=torch.long)])
        return req.last

    def step(
        self, cache: Any, decodes: Sequence[Request], chunks: Sequence[tuple[Request, int]]
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Run the running sequences ``decodes`` (their next inputs) and prompt ``chunks``
        (request, tokens); returns (logits of the decodes ``[D, V]``, logits of the chunks
        ``[C, V]``), None for none."""
        if not decodes and not chunks:
            return None, None
        if self.one_forward or not chunks:
            return self._together(cache, decodes, chunks)
        by_chunk: dict[int, torch.Tensor] = {}
        for group in group_chunks([(i, n) for i, (_, n) in enumerate(chunks)]):
            _, logits = self._together(cache, [], [chunks[i] for i, _ in group])
            for (i, _), row in zip(group, logits):
                by_chunk[i] = row
        chunk_logits = torch.stack([by_chunk[i] for i in range(len(chunks))])
        decoded = self._together(cache, decodes, [])[0] if decodes else None
        return decoded, chunk_logits

    def _together(
        self, cache: Any, decodes: Sequence[Request], chunks: Sequence[tuple[Request, int]]
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        rows: list[int | torch.Tensor] = [self._decode_input(cache, req) for req in decodes]
        rows += [req.prompt[req.computed : req.computed + n] for req, n in chunks]
        seq_ids = [req.seq_id for req in decodes] + [req.seq_id for req, _ in chunks]
        start = time.perf_counter()
        if any(req.spec.keeps_every_position for req, _ in chunks):
            logits = self._pooling_forward(cache, seq_ids, rows, len(decodes), chunks)
        else:
            logits = self.forward(cache, seq_ids, rows)
        prompt_tokens = sum(n for _, n in chunks)
        if prompt_tokens:
            self.budget.record(prompt_tokens, time.perf_counter() - start, len(decodes))
        d = len(decodes)
        return (logits[:d] if d else None), (logits[d:] if chunks else None)

    def _pooling_forward(
        self,
        cache: Any,
        seq_ids: list[int],
        rows: Sequence[int | torch.Tensor],
        first_chunk: int,
        chunks: Sequence[tuple[Request, int]],
    ) -> torch.Tensor:
        """A forward with embedding or prompt-logprob chunks in it: every position's hidden
        state is kept, the embeddings' chunks feed their pool states, the others their prompt
        scorers, and the rows' last positions give the logits as :meth:`forward` would."""
        ids, counts = step_batch(rows)
        hidden = hidden_step(self.model, cache, seq_ids, ids, counts)
        width = hidden.shape[1]
        for i, (req, n) in enumerate(chunks, start=first_chunk):
            if req.pool is not None:
                req.pool.add(hidden[i, width - n :])
            elif req.scorer is not None:
                req.scorer.add(self.model.head, hidden[i, width - n :], req.computed)
        return self.model.head(hidden[:, -1:])[:, 0]
