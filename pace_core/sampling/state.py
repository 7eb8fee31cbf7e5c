"""Per-row token state of a decode batch: prompt and generated tokens, in sparse form.

Penalties only touch tokens a row has seen, so the state is kept *sparse* (``O(B * L)`` with
``L`` = prompt + generated length, instead of ``O(B * V)``; V is up to 262144):

* :meth:`TokenState.seen_ids`: padded ids of prompt + generated tokens (repetition penalty).
* :meth:`TokenState.output_token_counts`: the generated ids with, per entry, how often that
  token was generated in the row so far (OpenAI frequency / presence penalties). Built from
  the history when first asked for, then maintained by :meth:`TokenState.append` with one
  ``[B, G]`` comparison per step (a batch without such penalties never pays for it).

Dense ``[B, V]`` views (:meth:`seen_mask`, :meth:`output_counts`) exist for plugins that want
them; they are built lazily from the history and then updated incrementally by ``append``.
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

    Attributes:
        prompts: the per-row prompt tensors.
        output_ids: long ``[B, cap]``, row ``i``'s generated ids in ``[:num_generated[i]]``.
        output_counts_sparse: int32 ``[B, cap]``, per entry of ``output_ids``: how often that
            token occurs among the row's generated tokens (0 past ``num_generated``); built
            on first use.
        num_generated: long ``[B]``.
    """

    _entry_counts: Tensor | None = None  # output_counts_sparse once asked for

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
        self._init_derived()

    def _init_derived(self) -> None:
        self._max_generated = int(self.num_generated.max()) if self.batch_size else 0
        self._arange = torch.arange(self.batch_size, device=self.device)
        self._prompt_cache: tuple[Tensor, Tensor] | None = None
        self._seen: Tensor | None = None
        self._counts: Tensor | None = None

    # ------------------------------------------------------------------ basics
    @property
    def batch_size(self) -> int:
        return len(self.prompts)

    def __len__(self) -> int:
        return len(self.prompts)

    def generated(self, row: int) -> Tensor:
        """The ids generated so far for ``row`` (1-D)."""
        return self.output_ids[row, : int(self.num_generated[row])]

    # ------------------------------------------------------------------ sparse views
    def _output_valid(self) -> Tensor:
        pos = torch.arange(self._max_generated, device=self.device)
        return pos[None, :] < self.num_generated[:, None]

    def prompt_ids(self) -> tuple[Tensor, Tensor]:
        """``(ids, valid)``, both ``[B, Lp]``: prompts right-padded with id 0 / valid False."""
        if self._prompt_cache is None:
            b, v = self.batch_size, self.vocab_size
            lp = max((p.numel() for p in self.prompts), default=0)
            ids = torch.zeros(b, lp, dtype=torch.long, device=self.device)
            valid = torch.zeros(b, lp, dtype=torch.bool, device=self.device)
            for i, p in enumerate(self.prompts):  # once per batch composition
                ids[i, : p.numel()] = p
                valid[i, : p.numel()] = True
            valid &= ids < v
            self._prompt_cache = (ids.masked_fill_(~valid, 0), valid)
        return self._prompt_cache

    def seen_ids(self) -> tuple[Tensor, Tensor]:
        """``(ids, valid)`` ``[B, Lp + G]``: prompt + generated ids (with repeats), padded."""
        p_ids, p_valid = self.prompt_ids()
        g = self._max_generated
        ids = torch.cat([p_ids, self.output_ids[:, :g]], dim=1)
        valid = torch.cat([p_valid, self._output_valid()], dim=1)
        return ids, valid

    def output_token_counts(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(ids, counts, valid)`` ``[B, G]``: generated ids, their per-row counts, mask."""
        g = self._max_generated
        return self.output_ids[:, :g], self.output_counts_sparse[:, :g], self._output_valid()

    @property
    def output_counts_sparse(self) -> Tensor:
        """Int32 ``[B, cap]``: per entry of ``output_ids``, how often that token occurs among
        the row's generated tokens (0 past ``num_generated``)."""
        if self._entry_counts is None:
            valid = self._output_valid()
            ids = self.output_ids[:, : self._max_generated]
            same = (ids[:, :, None] == ids[:, None, :]) & valid[:, None, :]
            counts = torch.zeros_like(self.output_ids, dtype=torch.int32)
            counts[:, : self._max_generated] = same.sum(dim=-1, dtype=torch.int32) * valid
            self._entry_counts = counts
        return self._entry_counts

    # ------------------------------------------------------------------ dense views (lazy)
    def seen_mask(self) -> Tensor:
        """Bool ``[B, V]``: token occurs in the prompt or the generated tokens of the row."""
        if self._seen is None:
            ids, valid = self.seen_ids()
            seen = torch.zeros(
                self.batch_size, self.vocab_size + 1, dtype=torch.bool, device=self.device
            )
            seen.scatter_(1, ids.masked_fill(~valid, self.vocab_size), True)
            self._seen = seen[:, : self.vocab_size].contiguous()
        return self._seen

    def output_counts(self) -> Tensor:
        """Int32 ``[B, V]``: how often each token was generated in the row (prompt excluded)."""
        if self._counts is None:
            ids, _, valid = self.output_token_counts()
            counts = torch.zeros(
                self.batch_size, self.vocab_size + 1, dtype=torch.int32, device=self.device
            )
            idx = ids.masked_fill(~valid, self.vocab_size)
            counts.scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.int32))
            self._counts = counts[:, : self.vocab_size].contiguous()
        return self._counts

    # ------------------------------------------------------------------ updates
    def _grow(self) -> None:
        cap = self.output_ids.shape[1]
        self.output_ids = torch.nn.functional.pad(self.output_ids, (0, cap))
        if self._entry_counts is not None:
            self._entry_counts = torch.nn.functional.pad(self._entry_counts, (0, cap))

    def append(self, tokens: Tensor) -> None:
        """Record one new token per row (``tokens``: LongTensor ``[B]``)."""
        b = self.batch_size
        tokens = tokens.to(device=self.device, dtype=torch.long).reshape(-1)
        if tokens.numel() != b:
            raise ValueError(f"append expects {b} tokens, got {tokens.numel()}")
        if b == 0:
            return
        if self._max_generated >= self.output_ids.shape[1]:
            self._grow()
        rows, pos = self._arange, self.num_generated
        if self._entry_counts is not None:
            g = self._max_generated
            matches = (self.output_ids[:, :g] == tokens[:, None]) & self._output_valid()
            self._entry_counts[:, :g] += matches.to(torch.int32)
            self._entry_counts[rows, pos] = matches.sum(dim=1, dtype=torch.int32) + 1
        self.output_ids[rows, pos] = tokens
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
        if self._entry_counts is not None:
            new._entry_counts = self._entry_counts.index_select(0, idx)
        new.num_generated = self.num_generated.index_select(0, idx)
        new._init_derived()
        if self._seen is not None:
            new._seen = self._seen.index_select(0, idx)
        if self._counts is not None:
            new._counts = self._counts.index_select(0, idx)
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
        new.output_ids = _cat_padded(self.output_ids, other.output_ids, cap)
        if self._entry_counts is not None or other._entry_counts is not None:
            new._entry_counts = _cat_padded(
                self.output_counts_sparse, other.output_counts_sparse, cap
            )
        new.num_generated = torch.cat([self.num_generated, other.num_generated.to(self.device)])
        new._init_derived()
        new._seen = _cat_dense(self, other, "_seen", TokenState.seen_mask)
        new._counts = _cat_dense(self, other, "_counts", TokenState.output_counts)
        return new


def _cat_padded(a: Tensor, b: Tensor, cap: int) -> Tensor:
    pad = torch.nn.functional.pad
    return torch.cat([pad(a, (0, cap - a.shape[1])), pad(b, (0, cap - b.shape[1])).to(a.device)])


def _cat_dense(
    a: TokenState, b: TokenState, attr: str, build: Callable[[TokenState], Tensor]
) -> Tensor | None:
    """Concatenate a lazy dense view; if only one side has it, build the other side exactly."""
    if getattr(a, attr) is None and getattr(b, attr) is None:
        return None
    return torch.cat([build(a), build(b).to(a.device)])
