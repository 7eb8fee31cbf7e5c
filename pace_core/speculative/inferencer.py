"""The :class:`~pace_core.speculative.protocol.Inferencer` of a pace decoder: a
:class:`~pace_core.models.decoder.DecoderLM` and a factory of its empty KV caches (the shape
``engine/beam.py`` uses), never the ``LLMModel`` that loaded them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from pace_core.models import limits
from pace_core.models.decoder import DecoderLM, forward_step, left_pad
from pace_core.sampling.argmax import greedy_argmax
from pace_core.speculative.protocol import DecodeOutput, PrefillOutput, TokenSampler

__all__ = ["KVRows", "ModelInferencer"]

Queries = torch.Tensor | Sequence[Sequence[int] | torch.Tensor]


class KVRows:
    """Rows ``0..B-1`` of a batch, each a sequence of one pace KV cache (any cache type)."""

    def __init__(self, cache: Any, seq_ids: list[int]) -> None:
        self.cache = cache
        self.seq_ids = list(seq_ids)

    def __len__(self) -> int:
        return len(self.seq_ids)

    def crop(self, num_tokens: int | Sequence[int]) -> None:
        """Drop the latest ``num_tokens`` (per row, or the same for all rows)."""
        counts = [num_tokens] * len(self) if isinstance(num_tokens, int) else list(num_tokens)
        if len(counts) != len(self):
            raise ValueError(f"crop got {len(counts)} counts for {len(self)} rows")
        for sid, n in zip(self.seq_ids, counts):
            if n:
                self.cache.crop(sid, int(n))

    def get_num_tokens(self) -> list[int]:
        return [self.cache.get_num_tokens(s) for s in self.seq_ids]

    def get_kv_states(self, row: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer ``(keys, values)`` ``[H, tokens, D]`` of one row (a copy)."""
        return self.cache.get_kv_states(self.seq_ids[row])

    def extend(self, count: int) -> None:
        """Add ``count`` empty sequences after the current rows."""
        self.seq_ids += self.cache.add_sequences(count)

    def retain(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (indices into this batch, in that order); free the others."""
        self.seq_ids = self.cache.retain([self.seq_ids[r] for r in rows])

    def release(self) -> None:
        """Free every row."""
        self.cache.retain([])
        self.seq_ids = []


def _as_batch(queries: Queries) -> tuple[torch.Tensor, list[int]]:
    """``ids [B, T]`` (right-aligned rows) and the real length of each row."""
    if isinstance(queries, torch.Tensor):
        ids = queries.long()
        if ids.dim() == 1:
            ids = ids.unsqueeze(0)
        return ids, [ids.shape[1]] * ids.shape[0]
    rows = [torch.as_tensor(q, dtype=torch.long).reshape(-1) for q in queries]
    ids, _ = left_pad(rows)
    return ids, [int(r.numel()) for r in rows]


class ModelInferencer:
    """Adapter: a decoder and its cache factory as an :class:`Inferencer` over :class:`KVRows`.

    ``new_cache()`` returns an empty KV cache of the model's type and budget (keyword options
    override the budget). ``logits_width`` (default: the model's) slices the vocabulary, e.g.
    a PARD draft whose extra mask token must never be proposed to a smaller target vocabulary.
    """

    def __init__(
        self,
        model: DecoderLM,
        new_cache: Callable[..., Any],
        logits_width: int | None = None,
    ) -> None:
        self.model = model
        self.new_cache = new_cache
        self.logits_width = logits_width

    @property
    def vocab_size(self) -> int:
        return self.logits_width or self.model.vocab_size

    @property
    def max_positions(self) -> int | None:
        return limits.max_positions(self.model.config)

    def new_kv(self, batch_size: int) -> KVRows:
        """A fresh cache of the model's ``kv_cache_type`` with ``batch_size`` empty rows."""
        cache = self.new_cache()
        return KVRows(cache, cache.add_sequences(batch_size))

    def forward(self, queries: Queries, kv: KVRows, *, all_logits: bool = True) -> torch.Tensor:
        """Raw logits ``[B, T, V]`` (or ``[B, V]`` of the last position) for the query tokens."""
        ids, num_new = _as_batch(queries)
        if ids.shape[0] != len(kv):
            raise ValueError(f"{ids.shape[0]} query rows for {len(kv)} cache rows")
        logits = forward_step(self.model, kv.cache, kv.seq_ids, ids, num_new, all_logits=all_logits)
        return logits if self.logits_width is None else logits[..., : self.logits_width]

    @staticmethod
    def _pick(logits: torch.Tensor, sampler: TokenSampler | None) -> Any:
        if sampler is None:
            tokens = greedy_argmax(logits)
            return tokens, torch.zeros_like(tokens, dtype=torch.bool)
        result = sampler.step(logits)
        return result.tokens, result.finished

    def prefill(
        self, query_token_ids: Queries, kv_cache: KVRows, sample_strategy: TokenSampler | None
    ) -> PrefillOutput:
        logits = self.forward(query_token_ids, kv_cache, all_logits=True)
        tokens, _ = self._pick(logits[:, -1], sample_strategy)
        return PrefillOutput(tokens.view(-1, 1), logits)

    def decode(
        self,
        query_token_ids: torch.Tensor,
        kv_cache: KVRows,
        max_new_tokens: int,
        sample_strategy: TokenSampler | None,
    ) -> DecodeOutput:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1 (got {max_new_tokens})")
        query = torch.as_tensor(query_token_ids, dtype=torch.long).view(len(kv_cache), -1)
        tokens: list[torch.Tensor] = []
        logits_out: list[torch.Tensor] = []
        done = torch.zeros(len(kv_cache), dtype=torch.bool)
        for _ in range(max_new_tokens):
            logits = self.forward(query, kv_cache, all_logits=False)
            new, finished = self._pick(logits, sample_strategy)
            tokens.append(new)
            logits_out.append(logits)
            done |= finished
            if bool(done.all()):
                break
            query = new.view(-1, 1)
        return DecodeOutput(torch.stack(tokens, dim=1), torch.stack(logits_out, dim=1))
