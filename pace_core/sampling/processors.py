"""Batched logits processors (one request per row, each with its own parameters).

Protocol: a *factory* ``factory(configs) -> processor | None`` is called once per batch
composition with the per-row :class:`SamplingConfig` list (``None`` = no row needs it) and
builds the per-row parameter tensors. The processor is then applied every decode step as
``logits = proc(logits, state)``: ``logits`` is a contiguous float ``[B, V]`` buffer owned by
the caller of the chain (processors may modify it in place and return it), row ``i`` belongs
to ``configs[i]``, ``state`` is the batch's :class:`TokenState`.

Order (``BUILTIN_PROCESSORS``) follows transformers' ``_get_logits_processor``: sequence bias
(our ``logit_bias``), repetition penalty, [OpenAI frequency/presence penalty, not in HF, placed
next to the other penalty as vLLM does], min_new_tokens, then the sampling-only warpers
temperature, top_k, top_p, min_p. Bias and penalties apply to every row (greedy rows included,
as in HF); the warpers only to rows with ``not cfg.is_greedy``. Rows whose parameter is neutral
are left out, so their logits stay bit-identical.

Cost per step: bias, penalties and min_new_tokens are sparse (``O(B * L)``, L = prompt +
generated length; no ``[B, V]`` tables); the warpers are a few vectorised ``[R, V]`` passes over
the R rows that use them (top-p uses a top-K candidate set instead of a full vocabulary sort).

``min_new_tokens`` reads ``cfg.eos_token_ids``: :class:`BatchSampler` resolves the model's EOS
into the configs before calling factories; rows with unknown EOS are not masked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from pace_core.sampling.config import SamplingConfig
from pace_core.sampling.state import TokenState

__all__ = [
    "BUILTIN_PROCESSORS",
    "FrequencyPresencePenaltyProcessor",
    "LogitBiasProcessor",
    "LogitsProcessor",
    "MinNewTokensProcessor",
    "MinPProcessor",
    "ProcessorFactory",
    "RepetitionPenaltyProcessor",
    "TemperatureProcessor",
    "TopKProcessor",
    "TopPProcessor",
    "build_processors",
]

NEG_INF = float("-inf")
_TOP_P_CANDIDATES = 256  # first top-p candidate-set size (x16 for rows it does not cover)


@runtime_checkable
class LogitsProcessor(Protocol):
    """Transforms a ``[B, V]`` logits batch; may work in place and returns the result."""

    def __call__(self, logits: Tensor, state: TokenState) -> Tensor: ...


ProcessorFactory = Callable[[Sequence[SamplingConfig]], "LogitsProcessor | None"]


def _row_index(flags: Sequence[bool]) -> Tensor | None:
    """Indices of flagged rows, or None when every row is flagged (no gather needed)."""
    if all(flags):
        return None
    return torch.tensor([i for i, f in enumerate(flags) if f], dtype=torch.long)


def _col(values: Iterable[float], dtype: torch.dtype = torch.float32) -> Tensor:
    """Per-row parameter as a ``[R, 1]`` column (broadcasts over the vocabulary)."""
    return torch.tensor(list(values), dtype=dtype).reshape(-1, 1)


class _RowwiseProcessor:
    """Base for dense warpers: ``_apply`` transforms the selected rows (in place if it likes)."""

    def __init__(self, rows: Tensor | None) -> None:
        self.rows = rows

    def __call__(self, logits: Tensor, state: TokenState) -> Tensor:
        if self.rows is None:
            return self._apply(logits)
        rows = self.rows.to(logits.device)
        return logits.index_copy_(0, rows, self._apply(logits.index_select(0, rows)))

    def _apply(self, x: Tensor) -> Tensor:
        raise NotImplementedError


def _flat_index(rows: Tensor | None, ids: Tensor, vocab: int) -> Tensor:
    """Flat indices ``row * V + id`` into a contiguous ``[B, V]`` for ``ids`` ``[B, L]``
    (restricted to ``rows`` -> ``[R, L]``)."""
    if rows is None:
        r = torch.arange(ids.shape[0], device=ids.device)
    else:
        r = rows.to(ids.device)
        ids = ids.index_select(0, r)
    return r[:, None] * vocab + ids


def _rows_of(rows: Tensor | None, t: Tensor) -> Tensor:
    return t if rows is None else t.index_select(0, rows.to(t.device))


def _contiguous(logits: Tensor) -> Tensor:
    return logits if logits.is_contiguous() else logits.contiguous()


# ---------------------------------------------------------------------------- processors
class LogitBiasProcessor:
    """``logits[r, t] += bias`` for each row's ``logit_bias`` entries (sparse, no [B, V])."""

    def __init__(self, rows: Tensor, cols: Tensor, values: Tensor) -> None:
        self.rows, self.cols, self.values = rows, cols, values

    @classmethod
    def from_configs(cls, configs: Sequence[SamplingConfig]) -> LogitBiasProcessor | None:
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        for i, cfg in enumerate(configs):
            for tok, bias in (cfg.logit_bias or {}).items():
                rows.append(i)
                cols.append(tok)
                vals.append(float(bias))
        if not rows:
            return None
        return cls(torch.tensor(rows), torch.tensor(cols), torch.tensor(vals))

    def __call__(self, logits: Tensor, state: TokenState) -> Tensor:
        logits = _contiguous(logits)
        dev, v = logits.device, logits.shape[-1]
        flat = self.rows.to(dev) * v + self.cols.to(dev)
        logits.view(-1).index_add_(0, flat, self.values.to(device=dev, dtype=logits.dtype))
        return logits


class RepetitionPenaltyProcessor:
    """HF repetition penalty over prompt + generated tokens: ``x < 0 ? x * p : x / p``.

    Sparse: gathers the seen tokens' logits (``O(B * L)``), never builds a ``[B, V]`` mask.
    """

    def __init__(self, rows: Tensor | None, penalty: Tensor) -> None:
        self.rows, self.penalty = rows, penalty

    @classmethod
    def from_configs(cls, configs: Sequence[SamplingConfig]) -> RepetitionPenaltyProcessor | None:
        flags = [c.repetition_penalty != 1.0 for c in configs]
        if not any(flags):
            return None
        penalties = [c.repetition_penalty for c, f in zip(configs, flags, strict=True) if f]
        return cls(_row_index(flags), _col(penalties))

    def __call__(self, logits: Tensor, state: TokenState) -> Tensor:
        ids, valid = state.seen_ids()
        if ids.numel() == 0:
            return logits
        logits = _contiguous(logits)
        flat = _flat_index(self.rows, ids, logits.shape[-1])
        valid = _rows_of(self.rows, valid)
        p = self.penalty.to(device=logits.device, dtype=logits.dtype)
        score = logits.view(-1).index_select(0, flat.reshape(-1)).reshape(flat.shape)
        new = torch.where(score < 0, score * p, score / p)
        # A token seen several times is written several times with the same value.
        logits.view(-1).index_copy_(0, flat.masked_select(valid), new.masked_select(valid))
        return logits


class FrequencyPresencePenaltyProcessor:
    """OpenAI penalties over generated tokens: ``x -= freq * count + presence * (count > 0)``.

    Sparse: uses the per-entry counts kept by :class:`TokenState` (``O(B * G)``).
    """

    def __init__(self, rows: Tensor | None, frequency: Tensor, presence: Tensor) -> None:
        self.rows, self.frequency, self.presence = rows, frequency, presence

    @classmethod
    def from_configs(
        cls, configs: Sequence[SamplingConfig]
    ) -> FrequencyPresencePenaltyProcessor | None:
        flags = [c.frequency_penalty != 0.0 or c.presence_penalty != 0.0 for c in configs]
        if not any(flags):
            return None
        active = [c for c, f in zip(configs, flags, strict=True) if f]
        return cls(
            _row_index(flags),
            _col(c.frequency_penalty for c in active),
            _col(c.presence_penalty for c in active),
        )

    def __call__(self, logits: Tensor, state: TokenState) -> Tensor:
        ids, counts, valid = state.output_token_counts()
        if ids.numel() == 0:
            return logits
        logits = _contiguous(logits)
        flat = _flat_index(self.rows, ids, logits.shape[-1])
        c = _rows_of(self.rows, counts).to(logits.dtype)
        valid = _rows_of(self.rows, valid)
        freq = self.frequency.to(device=logits.device, dtype=logits.dtype)
        pres = self.presence.to(device=logits.device, dtype=logits.dtype)
        score = logits.view(-1).index_select(0, flat.reshape(-1)).reshape(flat.shape)
        new = score - c * freq - (c > 0).to(logits.dtype) * pres
        logits.view(-1).index_copy_(0, flat.masked_select(valid), new.masked_select(valid))
        return logits


class MinNewTokensProcessor:
    """Sets each row's EOS logits to ``-inf`` while it has generated < ``min_new_tokens``."""

    def __init__(self, rows: Tensor, eos: Tensor, min_new: Tensor) -> None:
        self.rows, self.eos, self.min_new = rows, eos, min_new

    @classmethod
    def from_configs(cls, configs: Sequence[SamplingConfig]) -> MinNewTokensProcessor | None:
        rows: list[int] = []
        eos: list[int] = []
        min_new: list[int] = []
        for i, cfg in enumerate(configs):
            if cfg.min_new_tokens <= 0 or cfg.eos_token_ids is None:
                continue
            for tok in cfg.eos_token_ids:
                rows.append(i)
                eos.append(tok)
                min_new.append(cfg.min_new_tokens)
        if not rows:
            return None
        return cls(torch.tensor(rows), torch.tensor(eos), torch.tensor(min_new))

    def __call__(self, logits: Tensor, state: TokenState) -> Tensor:
        logits = _contiguous(logits)
        dev, v = logits.device, logits.shape[-1]
        rows = self.rows.to(dev)
        flat = rows * v + self.eos.to(dev)
        active = state.num_generated.to(dev).index_select(0, rows) < self.min_new.to(dev)
        current = logits.view(-1).index_select(0, flat)
        logits.view(-1).index_copy_(0, flat, torch.where(active, NEG_INF, current))
        return logits


class TemperatureProcessor(_RowwiseProcessor):
    """``x / temperature`` on sampling rows with temperature != 1."""

    def __init__(self, rows: Tensor | None, temperature: Tensor) -> None:
        super().__init__(rows)
        self.temperature = temperature

    @classmethod
    def from_configs(cls, configs: Sequence[SamplingConfig]) -> TemperatureProcessor | None:
        flags = [not c.is_greedy and c.temperature != 1.0 for c in configs]
        if not any(flags):
            return None
        temps = [c.temperature for c, f in zip(configs, flags, strict=True) if f]
        return cls(_row_index(flags), _col(temps))

    def _apply(self, x: Tensor) -> Tensor:
        return x.div_(self.temperature.to(device=x.device, dtype=x.dtype))


class TopKProcessor(_RowwiseProcessor):
    """Keeps the ``top_k`` largest logits per sampling row (ties with the k-th kept, as HF)."""

    def __init__(self, rows: Tensor | None, k: Tensor) -> None:
        super().__init__(rows)
        self.k = k
        self.kmax = int(k.max())

    @classmethod
    def from_configs(cls, configs: Sequence[SamplingConfig]) -> TopKProcessor | None:
        flags = [not c.is_greedy and c.top_k > 0 for c in configs]
        if not any(flags):
            return None
        ks = [c.top_k for c, f in zip(configs, flags, strict=True) if f]
        return cls(_row_index(flags), _col(ks, torch.long))

    def _apply(self, x: Tensor) -> Tensor:
        v = x.shape[-1]
        k = self.k.to(x.device)
        if self.kmax > v:
            k = k.clamp(max=v)
        top = torch.topk(x, min(self.kmax, v), dim=-1).values
        kth = top.gather(1, k - 1)
        return x.masked_fill_(x < kth, NEG_INF)


class TopPProcessor(_RowwiseProcessor):
    """Nucleus filter with HF's rule: drop tokens whose ascending cumulative prob <= 1 - top_p.

    Equivalently: keep, best first, the tokens whose *exclusive* cumulative prob < ``top_p``.
    Evaluated on the top-``K`` logits (``K`` = 256, x16 for rows whose top-K mass < ``top_p``)
    instead of sorting the vocabulary; probabilities are ``exp(x - logsumexp(x))``, sums in
    float64. Tokens tied with the last kept logit are kept (HF keeps an arbitrary subset).
    """

    def __init__(self, rows: Tensor | None, top_p: Tensor) -> None:
        super().__init__(rows)
        self.top_p = top_p

    @classmethod
    def from_configs(cls, configs: Sequence[SamplingConfig]) -> TopPProcessor | None:
        flags = [not c.is_greedy and c.top_p < 1.0 for c in configs]
        if not any(flags):
            return None
        ps = [c.top_p for c, f in zip(configs, flags, strict=True) if f]
        return cls(_row_index(flags), _col(ps, torch.float64))

    def _apply(self, x: Tensor) -> Tensor:
        v = x.shape[-1]
        p = self.top_p.to(x.device)
        lse = torch.logsumexp(x, dim=-1, keepdim=True)
        cut = torch.empty_like(lse)
        todo: Tensor | None = None  # rows still undecided (None = all)
        k = min(v, _TOP_P_CANDIDATES)
        while True:
            xs, ps, ls = (x, p, lse) if todo is None else (x[todo], p[todo], lse[todo])
            vals = torch.topk(xs, k, dim=-1).values
            csum = (vals - ls).exp_().to(torch.float64).cumsum_(dim=-1)
            done = (csum[:, -1:] >= ps).reshape(-1) | (k == v)
            exclusive = torch.nn.functional.pad(csum[:, :-1], (1, 0))
            n_keep = (exclusive < ps).sum(dim=-1, keepdim=True)  # >= 1: the top token
            row_cut = vals.gather(1, n_keep - 1)
            if todo is None and bool(done.all()):
                cut = row_cut
                break
            rows = torch.arange(x.shape[0], device=x.device) if todo is None else todo
            cut[rows[done]] = row_cut[done]
            todo = rows[~done]
            if todo.numel() == 0:
                break
            k = min(v, k * 16)
        return x.masked_fill_(x < cut, NEG_INF)


class MinPProcessor(_RowwiseProcessor):
    """Drops tokens with ``prob < min_p * max_prob`` on sampling rows (HF semantics).

    Computed in logit space (``x < max(x) + log(min_p)``): no softmax over the vocabulary.
    """

    def __init__(self, rows: Tensor | None, min_p: Tensor) -> None:
        super().__init__(rows)
        self.log_min_p = torch.log(min_p.to(torch.float64)).to(torch.float32)

    @classmethod
    def from_configs(cls, configs: Sequence[SamplingConfig]) -> MinPProcessor | None:
        flags = [not c.is_greedy and c.min_p > 0.0 for c in configs]
        if not any(flags):
            return None
        ps = [c.min_p for c, f in zip(configs, flags, strict=True) if f]
        return cls(_row_index(flags), _col(ps, torch.float64))

    def _apply(self, x: Tensor) -> Tensor:
        thr = x.amax(dim=-1, keepdim=True) + self.log_min_p.to(device=x.device, dtype=x.dtype)
        return x.masked_fill_(x < thr, NEG_INF)


# ---------------------------------------------------------------------------- registry
BUILTIN_PROCESSORS: list[tuple[str, int, ProcessorFactory]] = [
    ("logit_bias", 100, LogitBiasProcessor.from_configs),
    ("repetition_penalty", 200, RepetitionPenaltyProcessor.from_configs),
    ("frequency_presence_penalty", 300, FrequencyPresencePenaltyProcessor.from_configs),
    ("min_new_tokens", 400, MinNewTokensProcessor.from_configs),
    ("temperature", 500, TemperatureProcessor.from_configs),
    ("top_k", 600, TopKProcessor.from_configs),
    ("top_p", 700, TopPProcessor.from_configs),
    ("min_p", 800, MinPProcessor.from_configs),
]
"""``(name, order, factory)`` of the built-ins; applied in ascending ``order``."""


def _spec_fields(spec: Any) -> tuple[str, int, ProcessorFactory]:
    if isinstance(spec, tuple):
        name, order, factory = spec
        return name, order, factory
    return spec.name, spec.order, spec.factory  # e.g. pace_core.registry.ProcessorSpec


def build_processors(
    configs: Sequence[SamplingConfig], specs: Iterable[Any] | None = None
) -> list[tuple[str, LogitsProcessor]]:
    """Instantiate the processors a batch needs, sorted by order.

    ``specs``: ``(name, order, factory)`` tuples or objects with ``name``/``order``/``factory``
    attributes (registry entries); default :data:`BUILTIN_PROCESSORS`.
    """
    entries = sorted(
        (_spec_fields(s) for s in (BUILTIN_PROCESSORS if specs is None else specs)),
        key=lambda e: e[1],
    )
    built: list[tuple[str, LogitsProcessor]] = []
    for name, _, factory in entries:
        proc = factory(configs)
        if proc is not None:
            built.append((name, proc))
    return built
