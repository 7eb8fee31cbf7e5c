"""Per-step token selection for a continuously batched set of requests: :class:`BatchSampler`.

Choices:

* Greedy rows (``cfg.is_greedy``: ``do_sample=False`` or ``temperature == 0``) take the argmax
  of the processed logits (bias / penalties / min_new_tokens applied, warpers not), first index
  on ties. Sampling rows draw from ``softmax`` of the fully processed logits.
* Sampling uses one private ``torch.Generator`` per row (seeded from ``cfg.seed``, else from
  ``os.urandom``); the global torch RNG is never touched. Each row draws a single uniform
  number and inverts the row's CDF (``cumsum`` + ``searchsorted``, batched). This is the same
  distribution as ``torch.multinomial`` but an order of magnitude cheaper at V=262144 (the
  one-sample multinomial path draws V exponentials per row). A row's draws depend only on its
  own logits and seed, so a row gives the same tokens alone or in any batch.
* ``logprobs`` (default ``logprobs_mode="raw"``, as vLLM): ``log_softmax`` of the *raw model
  logits* before any processing, so they are comparable across sampling settings.
  ``logprobs_mode="processed"`` uses the logits actually sampled from (after all processors;
  for greedy rows after bias/penalties only).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from pace_core.sampling.argmax import greedy_argmax
from pace_core.sampling.config import SamplingConfig
from pace_core.sampling.grammar import (
    GrammarCompiler,
    RowGrammar,
    apply_bitmask,
    bitmask_words,
    check_constrained,
)
from pace_core.sampling.processors import BUILTIN_PROCESSORS, LogitsProcessor, build_processors
from pace_core.sampling.state import TokenState, as_row_index

__all__ = [
    "BatchSampler",
    "StepResult",
    "TokenLogprobs",
    "compute_logprobs",
    "make_generator",
    "sample_from_logits",
]

EosSpec = int | Iterable[int] | Sequence[Iterable[int] | None] | None


class TokenLogprobs(NamedTuple):
    """Log-probabilities of chosen tokens and, when ``k > 0``, the top-``k`` alternatives."""

    chosen: Tensor  # [N] float32
    top_ids: Tensor | None  # [N, k] long, best first
    top_values: Tensor | None  # [N, k] float32


def compute_logprobs(logits: Tensor, token_ids: Tensor, k: int = 0) -> TokenLogprobs:
    """``log_softmax(logits)`` (float32) at ``token_ids`` plus the top-``k`` per row.

    Computed as ``x - logsumexp(x)`` on the gathered entries only (no ``[N, V]`` output).
    Also serves prompt logprobs: pass the prefill logits ``[T-1, V]`` and ``prompt[1:]``.
    """
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    ids = token_ids.to(x.device).long().reshape(-1, 1)
    chosen = (x.gather(-1, ids) - lse).reshape(-1)
    if k <= 0:
        return TokenLogprobs(chosen, None, None)
    values, top_ids = torch.topk(x, min(k, x.shape[-1]), dim=-1)
    return TokenLogprobs(chosen, top_ids, values - lse)


LogprobEntry = tuple[float | None, list[int] | None, list[float] | None]
"""One token's (logprob, top-k ids, top-k logprobs), as the engine's ``Token`` events carry it."""


def logprob_entries(
    chosen: Tensor | None,
    top: tuple[Tensor, Tensor] | None,
    wanted: Sequence[int | None],
) -> list[LogprobEntry]:
    """Per row, the entry of a row that asked for ``wanted[i]`` top logprobs (None: none at
    all, 0: the chosen token's only); ``chosen [N]`` and ``top`` (ids, values ``[N, K]``, K >=
    every wanted k) as :func:`compute_logprobs` or the batch sampler gives them."""
    if chosen is None or all(k is None for k in wanted):
        return [(None, None, None)] * len(wanted)
    lps = chosen.tolist()
    ids, values = (t.tolist() for t in top) if top is not None else (None, None)
    out: list[LogprobEntry] = []
    for i, k in enumerate(wanted):
        if k is None:
            out.append((None, None, None))
        elif k and ids is not None:
            out.append((lps[i], ids[i][:k], values[i][:k]))
        else:
            out.append((lps[i], None, None))
    return out


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A private generator seeded with ``seed`` or, if None, with 64 fresh OS-random bits."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int.from_bytes(os.urandom(8), "little") if seed is None else seed)
    return gen


def sample_from_logits(
    logits: Tensor, generators: Sequence[torch.Generator], inplace: bool = False
) -> Tensor:
    """One token per row from ``softmax(logits)``, row ``i`` using ``generators[i]`` only.

    Inverse-CDF sampling with one uniform draw per row; ``-inf`` logits are never chosen.
    ``inplace=True`` lets it overwrite ``logits`` (saves a ``[N, V]`` allocation).
    """
    n, v = logits.shape
    if n == 0:
        return torch.empty(0, dtype=torch.long, device=logits.device)
    m = logits.amax(dim=-1, keepdim=True)
    weights = logits.sub_(m) if inplace else logits - m
    cdf = weights.exp_().cumsum_(dim=-1)  # CPU cumsum accumulates in float64
    total = cdf[:, -1:].contiguous()
    u = torch.cat(
        [torch.rand(1, generator=g, dtype=torch.float64, device=logits.device) for g in generators]
    )
    target = (u.reshape(-1, 1) * total.double()).to(cdf.dtype)
    idx = torch.searchsorted(cdf, target, right=True)
    # ``target`` may round up to ``total``: fall back to the last token that adds mass.
    last = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(idx, last).clamp_(max=v - 1).reshape(-1)


@dataclass(frozen=True)
class StepResult:
    """Outcome of one :meth:`BatchSampler.step`, row-aligned with the batch.

    Attributes:
        tokens: chosen ids, long ``[B]``.
        logprobs: float32 ``[B]`` chosen-token logprob, NaN for rows with ``logprobs=None``;
            None when no row asked for logprobs.
        top_logprobs: ``(ids [B, k], values [B, k])`` with ``k`` the batch's largest request,
            best first; a row asking for fewer (or none) is padded with id -1 / value -inf.
        stopped_eos: the token is one of the row's EOS ids (never for ``ignore_eos`` rows).
        stopped_length: the row has now generated ``max_new_tokens`` tokens.
    """

    tokens: Tensor
    logprobs: Tensor | None
    top_logprobs: tuple[Tensor, Tensor] | None
    stopped_eos: Tensor
    stopped_length: Tensor

    @property
    def finished(self) -> Tensor:
        """Bool ``[B]``: the row stops here (EOS or length; stop strings are checked on text)."""
        return self.stopped_eos | self.stopped_length


def _resolve_eos(eos: EosSpec, n: int) -> list[tuple[int, ...] | None]:
    """Per-row model EOS ids: None, an int, ints (same for all rows) or one set per row."""
    if eos is None:
        return [None] * n
    if isinstance(eos, Tensor):
        eos = eos.tolist()
    if isinstance(eos, int):
        return [(eos,)] * n
    items = list(eos)
    if all(isinstance(e, int) for e in items):
        return [tuple(items)] * n
    if len(items) != n:
        raise ValueError(f"eos_token_ids has {len(items)} per-row entries for {n} rows")
    return [None if e is None else tuple(int(t) for t in e) for e in items]


def check_token_ids(cfg: SamplingConfig, vocab_size: int) -> None:
    """``ValueError`` when ``cfg``'s ``logit_bias`` or EOS ids fall outside the vocabulary."""
    for what, ids in (("logit_bias token ids", cfg.logit_bias or {}),
                      ("eos_token_id", cfg.eos_token_ids or ())):  # fmt: skip
        if bad := [t for t in ids if t >= vocab_size]:
            raise ValueError(f"{what} must be < vocab_size={vocab_size} (got {bad})")


class BatchSampler:
    """Applies the logits processors and picks one token per row, tracking per-row state.

    Args:
        configs: one :class:`SamplingConfig` per row.
        prompts: one unpadded 1-D prompt id tensor per row.
        vocab_size: logits width ``V``.
        eos_token_ids: the model's EOS, used for rows whose ``cfg.eos_token_id`` is None: an int,
            a collection of ints (all rows), or one collection (or None) per row.
        processors: ``(name, order, factory)`` tuples or registry specs; default built-ins.
        logprobs_mode: ``"raw"`` (default) or ``"processed"``, see module doc.
        device: device of the state tensors and generators (default CPU).
        grammar: builds the matchers of rows with ``json_schema`` / ``grammar``; their token
            mask is applied before every other processor (required when a row has one).
    """

    def __init__(
        self,
        configs: Sequence[SamplingConfig],
        prompts: Sequence[Tensor | Sequence[int]],
        vocab_size: int,
        eos_token_ids: EosSpec = None,
        *,
        processors: Iterable[Any] | None = None,
        logprobs_mode: str = "raw",
        device: torch.device | str | None = None,
        grammar: GrammarCompiler | None = None,
    ) -> None:
        if len(configs) != len(prompts):
            raise ValueError(f"{len(configs)} configs for {len(prompts)} prompts")
        if logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed' (got {logprobs_mode!r})")
        self.vocab_size = int(vocab_size)
        self.logprobs_mode = logprobs_mode
        self.specs = list(BUILTIN_PROCESSORS if processors is None else processors)
        self.state = TokenState(prompts, vocab_size, device)
        eos_rows = _resolve_eos(eos_token_ids, len(configs))
        self.configs = [self._prepare(c, e) for c, e in zip(configs, eos_rows, strict=True)]
        dev = self.state.device
        self.generators: list[torch.Generator | None] = [
            None if c.is_greedy else make_generator(c.seed, dev) for c in self.configs
        ]
        check_constrained(self.configs, grammar)
        self.grammars: list[RowGrammar | None] = [
            grammar.row(c) if grammar is not None and c.constrained else None
            for c in self.configs
        ]
        self._rebuild()

    # ------------------------------------------------------------------ batch composition
    def _prepare(self, cfg: SamplingConfig, model_eos: tuple[int, ...] | None) -> SamplingConfig:
        if cfg.num_beams > 1:
            raise NotImplementedError(
                f"BatchSampler does not do beam search (num_beams={cfg.num_beams})"
            )
        if cfg.eos_token_id is None and model_eos:
            cfg = cfg.merged(eos_token_id=list(model_eos))
        check_token_ids(cfg, self.vocab_size)
        return cfg

    def _rebuild(self) -> None:
        """Per-row tensors and processors; run once per batch composition, not per step."""
        cfgs = self.configs
        dev = self.state.device
        b = len(cfgs)
        self.processors: list[tuple[str, LogitsProcessor]] = build_processors(cfgs, self.specs)
        sample = [i for i, c in enumerate(cfgs) if not c.is_greedy]
        greedy = [i for i, c in enumerate(cfgs) if c.is_greedy]
        self._sample_rows = sample
        self._sample_idx = torch.tensor(sample, dtype=torch.long, device=dev)
        self._greedy_idx = torch.tensor(greedy, dtype=torch.long, device=dev)
        self._max_new = torch.tensor([c.max_new_tokens for c in cfgs], dtype=torch.long, device=dev)
        eos = [() if c.ignore_eos else (c.eos_token_ids or ()) for c in cfgs]
        width = max((len(e) for e in eos), default=0)
        self._eos_table = torch.tensor(
            [list(e) + [-1] * (width - len(e)) for e in eos], dtype=torch.long, device=dev
        ).reshape(b, width)
        lp_rows = [i for i, c in enumerate(cfgs) if c.logprobs is not None]
        self._lp_idx = (
            None if len(lp_rows) == b else torch.tensor(lp_rows, dtype=torch.long, device=dev)
        )
        self._lp_any = bool(lp_rows)
        ks = [min(cfgs[i].logprobs or 0, self.vocab_size) for i in lp_rows]
        self._lp_k = max(ks, default=0)
        cols = torch.arange(self._lp_k, device=dev)
        self._lp_pad = cols[None, :] >= torch.tensor(ks, dtype=torch.long, device=dev)[:, None]
        self._grammar_rows = [i for i, g in enumerate(self.grammars) if g is not None]
        self._grammar_idx = torch.tensor(self._grammar_rows, dtype=torch.long, device=dev)
        self._bitmask = torch.zeros(
            len(self._grammar_rows), bitmask_words(self.vocab_size), dtype=torch.int32
        )

    @property
    def batch_size(self) -> int:
        return len(self.configs)

    def __len__(self) -> int:
        return len(self.configs)

    def select_rows(self, rows: Tensor | Sequence[int]) -> None:
        """Keep only ``rows`` (indices or bool mask), in that order; state and RNGs follow."""
        idx = as_row_index(rows, self.batch_size)
        keep = idx.tolist()
        self.configs = [self.configs[i] for i in keep]
        self.generators = [self.generators[i] for i in keep]
        self.grammars = [self.grammars[i] for i in keep]
        self.state = self.state.select(idx)
        self._rebuild()

    def add(self, other: BatchSampler) -> None:
        """Append ``other``'s rows (e.g. new requests); ``other`` must not be used afterwards."""
        if other.vocab_size != self.vocab_size:
            raise ValueError(f"vocab_size mismatch: {self.vocab_size} vs {other.vocab_size}")
        self.configs = self.configs + other.configs
        self.generators = self.generators + other.generators
        self.grammars = self.grammars + other.grammars
        self.state = self.state.concat(other.state)
        self._rebuild()

    def grammar_failure(self, row: int) -> str | None:
        """Why row ``row``'s grammar engine gave up (then it forced EOS), or None."""
        grammar = self.grammars[row]
        return None if grammar is None else grammar.failure

    # ------------------------------------------------------------------ decoding
    def process(self, logits: Tensor) -> Tensor:
        """The processed float32 logits; ``logits`` itself is never modified.

        Returns ``logits`` itself (no copy) when it is float32 and no processor or grammar
        applies. Grammar rows are masked first, so the warpers see allowed tokens only.
        """
        if not self.processors and not self._grammar_rows:
            return logits.float()
        x = logits.to(torch.float32, copy=True)
        if self._grammar_rows:
            self._mask_grammar_rows(x)
        for _, proc in self.processors:
            x = proc(x, self.state)
        return x

    def _mask_grammar_rows(self, x: Tensor) -> None:
        rows, mask = self._grammar_rows, self._bitmask
        for j, i in enumerate(rows):
            grammar = self.grammars[i]
            assert grammar is not None
            grammar.mask_into(mask, j)
        if len(rows) == x.shape[0]:
            apply_bitmask(x, mask)
            return
        sub = x.index_select(0, self._grammar_idx)
        apply_bitmask(sub, mask)
        x.index_copy_(0, self._grammar_idx, sub)

    def step(self, logits: Tensor) -> StepResult:
        """Pick one token per row from ``logits [B, V]`` and record it in the state."""
        b, v = self.batch_size, self.vocab_size
        if logits.dim() != 2 or tuple(logits.shape) != (b, v):
            raise ValueError(f"expected logits of shape ({b}, {v}), got {tuple(logits.shape)}")
        x = self.process(logits)
        raw = self.logprobs_mode == "raw"
        if raw:
            tokens = self._pick(x, scratch=x is not logits)
            logprobs, top = self._logprobs(logits, tokens)
        else:
            tokens = self._pick(x, scratch=False)
            logprobs, top = self._logprobs(x, tokens)
        self.state.append(tokens)
        if self._grammar_rows:
            chosen = tokens.tolist()
            for i in self._grammar_rows:
                grammar = self.grammars[i]
                assert grammar is not None
                grammar.accept(chosen[i])
        if self._eos_table.shape[1]:
            stopped_eos = (tokens[:, None] == self._eos_table).any(dim=-1)
        else:
            stopped_eos = torch.zeros(b, dtype=torch.bool, device=tokens.device)
        stopped_length = self.state.num_generated >= self._max_new
        return StepResult(tokens, logprobs, top, stopped_eos, stopped_length)

    def _pick(self, x: Tensor, scratch: bool) -> Tensor:
        """Greedy argmax / sampling per row; ``scratch``: ``x`` may be overwritten."""
        b = x.shape[0]
        n_sample = len(self._sample_rows)
        if n_sample == 0:
            return greedy_argmax(x)
        gens: list[Any] = [self.generators[i] for i in self._sample_rows]
        if n_sample == b:
            return sample_from_logits(x, gens, inplace=scratch)
        tokens = torch.empty(b, dtype=torch.long, device=x.device)
        g_idx, s_idx = self._greedy_idx, self._sample_idx
        tokens.index_copy_(0, g_idx, greedy_argmax(x.index_select(0, g_idx)))
        sampled = sample_from_logits(x.index_select(0, s_idx), gens, inplace=True)
        return tokens.index_copy_(0, s_idx, sampled)

    def _logprobs(
        self, src: Tensor, tokens: Tensor
    ) -> tuple[Tensor | None, tuple[Tensor, Tensor] | None]:
        if not self._lp_any:
            return None, None
        b, k = self.batch_size, self._lp_k
        rows = self._lp_idx
        if rows is None:
            res = compute_logprobs(src, tokens, k)
        else:
            res = compute_logprobs(src.index_select(0, rows), tokens.index_select(0, rows), k)
        chosen = res.chosen
        if rows is not None:
            chosen = torch.full((b,), float("nan"), device=src.device).index_copy_(0, rows, chosen)
        if k == 0 or res.top_ids is None or res.top_values is None:
            return chosen, None
        ids = res.top_ids.masked_fill(self._lp_pad, -1)
        vals = res.top_values.masked_fill(self._lp_pad, float("-inf"))
        if rows is not None:
            ids = torch.full((b, k), -1, dtype=torch.long, device=src.device).index_copy_(
                0, rows, ids
            )
            vals = torch.full((b, k), float("-inf"), device=src.device).index_copy_(0, rows, vals)
        return chosen, (ids, vals)
