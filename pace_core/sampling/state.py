"""Per-row token state of a decode batch: prompt/generated tokens and derived per-token tables.

The compact source of truth is the prompt list plus a ``[B, cap]`` history of generated ids.
The dense ``[B, V]`` tables used by penalties are built lazily (only when a processor asks for
them, so batches without penalties never allocate ``B * V`` memory) and are then kept up to
date incrementally by :meth:`TokenState.append` with one scatter per step.

* ``seen_mask()``: bool ``[B, V]``, token occurs in prompt or generated (repetition penalty).
  A bool mask (1 byte/entry) suffices because HF applies the penalty once per distinct token.
* ``output_counts()``: int32 ``[B, V]``, occurrences among generated tokens (OpenAI penalties).

Prompt ids >= ``vocab_size`` (embedding larger than the LM head) are ignored, as in HF.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["TokenState", "as_row_index"]

_MIN_CAP = 16


def _as_prompt(p: Tensor | Sequence[int], device: torch.device) -> Tensor:
    t = torch.as_tensor(p, dtype=torch.long, device=device).reshape(-1)
    if t.numel() and int(t.min()) < 0:
        raise ValueError(f"prompt token ids must be >= 0 (got {int(t.min())})")
    return t


def as_row_index(rows: Tensor | Sequence[int], n: int) -> Tensor:
    """Row selector (indices, negative allowed, or a bool mask) as a LongTensor of indices."""
    r = torch.as_tensor(rows)
    if r.dtype == torch.bool:
        if r.numel() != n:
            raise ValueError(f"row mask has {r.numel()} entries for a batch of {n}")
        return r.nonzero().reshape(-1)
    r = r.to(torch.long).reshape(-1)
    if r.numel() and (int(r.min()) < -n or int(r.max()) >= n):
        raise IndexError(f"row index out of range for a batch of {n}: {r.tolist()}")
    return torch.where(r < 0, r + n, r)


class TokenState:
    """Token history of ``B`` independent rows over a vocabulary of ``vocab_size``.

    Args:
        prompts: one unpadded 1-D id tensor (or int list) per row.
        vocab_size: logits width ``V``.
        device: where the tensors live (default CPU).
    """

    def __init__(
        self,
        prompts: Sequence[Tensor | Sequence[int]],
        vocab_size: int,
        device: torch.device | str | None = None,
    ) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1 (got {vocab_size})")
        self.vocab_size = int(vocab_size)
        self.device = torch.device(device or "cpu")
        self.prompts: list[Tensor] = [_as_prompt(p, self.device) for p in prompts]
        b = len(self.prompts)
        self.output_ids = torch.zeros(b, _MIN_CAP, dtype=torch.long, device=self.device)
        self.num_generated = torch.zeros(b, dtype=torch.long, device=self.device)
        self._max_generated = 0
        self._seen: Tensor | None = None
        self._counts: Tensor | None = None
        self._arange = torch.arange(b, device=self.device)

    # ------------------------------------------------------------------ basics
    @property
    def batch_size(self) -> int:
        return len(self.prompts)

    def __len__(self) -> int:
        return len(self.prompts)

    def generated(self, row: int) -> Tensor:
        """The ids generated so far for ``row`` (1-D)."""
        return self.output_ids[row, : int(self.num_generated[row])]

    # ------------------------------------------------------------------ lazy dense tables
    def _padded(self, seqs: Sequence[Tensor]) -> Tensor:
        """Rows padded with ``V`` (an extra, discarded column), ids clamped to ``V``."""
        v = self.vocab_size
        if not seqs or max(s.numel() for s in seqs) == 0:
            return torch.full((len(seqs), 1), v, dtype=torch.long, device=self.device)
        padded = torch.nn.utils.rnn.pad_sequence(list(seqs), batch_first=True, padding_value=v)
        return padded.clamp_(max=v)

    def _output_padded(self) -> Tensor:
        n = self._max_generated
        ids = self.output_ids[:, :n]
        pos = torch.arange(n, device=self.device)
        return ids.masked_fill(pos[None, :] >= self.num_generated[:, None], self.vocab_size)

    def seen_mask(self) -> Tensor:
        """Bool ``[B, V]``: token occurs in the prompt or the generated tokens of the row."""
        if self._seen is None:
            b, v = self.batch_size, self.vocab_size
            seen = torch.zeros(b, v + 1, dtype=torch.bool, device=self.device)
            seen.scatter_(1, self._padded(self.prompts), True)
            if self._max_generated:
                seen.scatter_(1, self._output_padded(), True)
            self._seen = seen[:, :v].contiguous()
        return self._seen

    def output_counts(self) -> Tensor:
        """Int32 ``[B, V]``: how often each token was generated in the row (prompt excluded)."""
        if self._counts is None:
            b, v = self.batch_size, self.vocab_size
            counts = torch.zeros(b, v + 1, dtype=torch.int32, device=self.device)
            if self._max_generated:
                idx = self._output_padded()
                counts.scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.int32))
            self._counts = counts[:, :v].contiguous()
        return self._counts

    def release_tables(self) -> None:
        """Drop the dense tables (they are rebuilt exactly from the history on next use)."""
        self._seen = None
        self._counts = None

    # ------------------------------------------------------------------ updates
    def append(self, tokens: Tensor) -> None:
        """Record one new token per row (``tokens``: LongTensor ``[B]``)."""
        b = self.batch_size
        tokens = tokens.to(device=self.device, dtype=torch.long).reshape(-1)
        if tokens.numel() != b:
            raise ValueError(f"append expects {b} tokens, got {tokens.numel()}")
        if b == 0:
            return
        if self._max_generated >= self.output_ids.shape[1]:
            grown = torch.zeros(
                b, 2 * self.output_ids.shape[1], dtype=torch.long, device=self.device
            )
            grown[:, : self.output_ids.shape[1]] = self.output_ids
            self.output_ids = grown
        rows = self._arange
        self.output_ids[rows, self.num_generated] = tokens
        self.num_generated += 1
        self._max_generated += 1
        in_vocab = tokens.clamp(max=self.vocab_size - 1)
        if self._seen is not None:
            self._seen[rows, in_vocab] = True
        if self._counts is not None:
            self._counts[rows, in_vocab] += 1

    def select(self, rows: Tensor | Sequence[int]) -> TokenState:
        """A new state holding only ``rows`` (indices or a bool mask), in that order."""
        idx = as_row_index(rows, self.batch_size)
        new = TokenState.__new__(TokenState)
        new.vocab_size, new.device = self.vocab_size, self.device
        new.prompts = [self.prompts[i] for i in idx.tolist()]
        new.output_ids = self.output_ids.index_select(0, idx)
        new.num_generated = self.num_generated.index_select(0, idx)
        new._max_generated = int(new.num_generated.max()) if idx.numel() else 0
        new._seen = None if self._seen is None else self._seen.index_select(0, idx)
        new._counts = None if self._counts is None else self._counts.index_select(0, idx)
        new._arange = torch.arange(idx.numel(), device=self.device)
        return new

    def concat(self, other: TokenState) -> TokenState:
        """A new state with ``other``'s rows appended after this state's rows."""
        if other.vocab_size != self.vocab_size:
            raise ValueError(
                f"cannot concat token states with vocab_size {self.vocab_size} and "
                f"{other.vocab_size}"
            )
        new = TokenState.__new__(TokenState)
        new.vocab_size, new.device = self.vocab_size, self.device
        new.prompts = self.prompts + [p.to(self.device) for p in other.prompts]
        cap = max(self.output_ids.shape[1], other.output_ids.shape[1])
        new.output_ids = torch.cat(
            [_pad_cols(self.output_ids, cap), _pad_cols(other.output_ids, cap).to(self.device)]
        )
        new.num_generated = torch.cat([self.num_generated, other.num_generated.to(self.device)])
        new._max_generated = max(self._max_generated, other._max_generated)
        new._seen = _cat_tables(self, other, "_seen", TokenState.seen_mask)
        new._counts = _cat_tables(self, other, "_counts", TokenState.output_counts)
        new._arange = torch.arange(new.batch_size, device=self.device)
        return new


def _pad_cols(t: Tensor, cap: int) -> Tensor:
    if t.shape[1] == cap:
        return t
    return torch.nn.functional.pad(t, (0, cap - t.shape[1]))


def _cat_tables(
    a: TokenState, b: TokenState, attr: str, build: Callable[[TokenState], Tensor]
) -> Tensor | None:
    """Concatenate a lazy table; if only one side has it, build the other side exactly."""
    ta, tb = getattr(a, attr), getattr(b, attr)
    if ta is None and tb is None:
        return None
    return torch.cat([build(a), build(b).to(a.device)])
