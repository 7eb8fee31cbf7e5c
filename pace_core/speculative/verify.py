"""Verification of draft tokens against one target forward over ``[last, d_1 .. d_k]``.

Logits processors are applied *as plain decoding would*: position ``j`` (which predicts the
token after ``d_j``) is processed with a copy of the row's :class:`TokenState` that has
``d_1 .. d_j`` appended, so penalties, ``min_new_tokens`` and bias see exactly the history
they would see without speculation. Built-in processors are pure functions of
``(logits, state)`` and all supported; a plugin processor must say so with a truthy
``speculative_safe`` attribute (on the processor object), else speculation refuses the batch.

Acceptance per row:

* greedy rows: ``t_j = argmax(processed_j)``; drafts are accepted while ``d_{j+1} == t_j``;
  the first mismatch (or, with all accepted, the bonus position) contributes ``t_j``. The
  output is token for token the one of non-speculative greedy decoding.
* sampling rows (standard speculative sampling): with ``p_j = softmax(processed_j)`` and the
  draft's ``q_j`` (one-hot for deterministic drafts), ``d_{j+1}`` is accepted with probability
  ``min(1, p_j(d) / q_j(d))``; on rejection a token is drawn from ``norm(max(0, p_j - q_j))``
  and the round ends; if all drafts pass, a bonus token is drawn from ``p_k``. Every draw uses
  the request's own ``torch.Generator``, so seeded requests are reproducible and the global
  RNG is never touched. The emitted tokens follow the target distribution exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pace_core.errors import ConfigError
from pace_core.sampling.argmax import greedy_argmax
from pace_core.sampling.processors import BUILTIN_PROCESSORS
from pace_core.sampling.sampler import sample_from_logits
from pace_core.sampling.state import TokenState

__all__ = [
    "SAFE_PROCESSORS",
    "align_left",
    "append_ragged",
    "check_processors",
    "check_speculable",
    "process_positions",
    "stop_flags",
    "verify_batch",
    "verify_row",
]

SAFE_PROCESSORS = frozenset(name for name, _, _ in BUILTIN_PROCESSORS)
"""Built-in processors: pure functions of ``(logits, state)``, supported with speculation."""


def check_speculable(sampler: Any) -> None:
    """Raise ConfigError when a row of ``sampler`` cannot be decoded speculatively: a grammar
    (its matcher would have to be rolled back per rejected draft) or an unsafe processor."""
    if any(c.constrained for c in sampler.configs):
        raise ConfigError(
            "json_schema / grammar (response_format, tools) cannot be combined with "
            "speculative decoding: serve or load the model without spec_config"
        )
    check_processors(sampler.processors)


def check_processors(processors: Sequence[tuple[str, Any]]) -> None:
    """Raise ConfigError for an active processor that is not known to be speculation-safe."""
    for name, proc in processors:
        if name not in SAFE_PROCESSORS and not getattr(proc, "speculative_safe", False):
            raise ConfigError(
                f"logits processor {name!r} is active for this request but is not marked "
                "speculative_safe: speculative decoding applies processors to several "
                "positions per step with a provisional token history, which is only correct "
                "for pure functions of (logits, state). Set `speculative_safe = True` on the "
                "processor if it is one, or load the model without spec_config."
            )


def align_left(logits: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """Right-aligned rows ``[B, T, V]`` (row ``b`` real in its last ``lengths[b]`` columns) to
    left-aligned ones: ``out[b, j]`` is row ``b``'s ``j``-th position (pads hold junk)."""
    b, t, v = logits.shape
    if all(n == t for n in lengths):
        return logits
    n = torch.tensor(list(lengths), dtype=torch.long)
    idx = (t - n[:, None] + torch.arange(t)[None, :]).clamp(max=t - 1)
    return logits.gather(1, idx[:, :, None].expand(b, t, v))


def process_positions(
    processors: Sequence[tuple[str, Any]],
    state: TokenState,
    logits: torch.Tensor,
    drafts: Sequence[Sequence[int]],
) -> torch.Tensor:
    """Processed float32 ``[B, T, V]`` of left-aligned raw ``logits``; position ``j`` of row
    ``b`` sees ``state`` plus ``drafts[b][:j]`` (``state`` itself is not modified)."""
    if not processors:
        return logits.float()
    b, t, _ = logits.shape
    st = state.select(torch.arange(b)) if t > 1 else state
    out = []
    for j in range(t):
        x = logits[:, j].to(torch.float32, copy=True)
        for _, proc in processors:
            x = proc(x, st)
        out.append(x)
        if j + 1 < t:
            st.append(torch.tensor([d[j] if j < len(d) else 0 for d in drafts], dtype=torch.long))
    return torch.stack(out, dim=1)


def _draw(logits: torch.Tensor, generator: torch.Generator) -> int:
    return int(sample_from_logits(logits.reshape(1, -1).clone(), [generator])[0])


def verify_row(
    processed: torch.Tensor,
    drafts: Sequence[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> tuple[list[int], int]:
    """Accept a prefix of ``drafts`` (see the module doc); returns the emitted tokens (accepted
    drafts + one correction/bonus token) and the number of accepted drafts.

    Args:
        processed: processed logits ``[len(drafts) + 1, V]`` of this row's positions.
        drafts: the proposed token ids.
        draft_probs: ``q`` ``[len(drafts), V]`` the drafts were sampled from; None = one-hot.
        generator: the request's generator; None = greedy row.
    """
    k = len(drafts)
    if generator is None:
        best = greedy_argmax(processed[: k + 1]).tolist()
        m = 0
        while m < k and drafts[m] == best[m]:
            m += 1
        return best[: m + 1], m
    probs = torch.softmax(processed[: k + 1].double(), dim=-1)
    for j, d in enumerate(drafts):
        u = float(torch.rand(1, generator=generator, dtype=torch.float64))
        q_d = 1.0 if draft_probs is None else float(draft_probs[j, d])
        if u * q_d < float(probs[j, d]):
            continue
        if draft_probs is None:  # residual of a one-hot q: p without d
            x = processed[j].clone()
            x[d] = float("-inf")
        else:
            r = (probs[j] - draft_probs[j].double()).clamp_(min=0.0)
            x = (r if float(r.sum()) > 0 else probs[j]).log().float()
        token = _draw(x, generator) if bool(torch.isfinite(x).any()) else d
        return [*drafts[:j], token], j
    return [*drafts, _draw(processed[k], generator)], k


def verify_batch(
    sampler: Any,
    logits: torch.Tensor,
    drafts: Sequence[Sequence[int]],
    draft_probs: Sequence[torch.Tensor | None],
) -> list[tuple[list[int], int]]:
    """:func:`verify_row` for every row of a :class:`~pace_core.sampling.sampler.BatchSampler`.

    Args:
        sampler: the batch's sampler (processors, token state, per-row generators); row ``b``
            of the sampler is row ``b`` of ``logits``. Not modified.
        logits: raw left-aligned logits ``[B, T, V]``; row ``b`` real in its first
            ``len(drafts[b]) + 1`` positions.
        drafts, draft_probs: the proposal of each row (``[]`` / ``None`` for a row without
            drafts, e.g. one whose first token comes from its prefill).

    Returns:
        per row, the emitted tokens (accepted drafts + one target token) and the number of
        accepted drafts.
    """
    processed = process_positions(sampler.processors, sampler.state, logits, drafts)
    return [
        verify_row(processed[i, : len(d) + 1], d, draft_probs[i], sampler.generators[i])
        for i, d in enumerate(drafts)
    ]


def stop_flags(config: Any, token: int, generated: int) -> tuple[bool, bool]:
    """``(hit_eos, hit_length)`` of a row's ``generated``-th token (counting it) under its
    sampler-resolved :class:`~pace_core.sampling.config.SamplingConfig`."""
    eos = not config.ignore_eos and token in (config.eos_token_ids or ())
    return eos, generated >= config.max_new_tokens


def append_ragged(state: TokenState, tokens: Sequence[Sequence[int]]) -> TokenState:
    """``state`` with ``tokens[b]`` appended to row ``b`` (rows may get different counts).

    Uses only :class:`TokenState`'s public API: rows are grouped by count, appended, and put
    back in order. Returns the (possibly new) state.
    """
    lengths = [len(t) for t in tokens]
    if len(set(lengths)) <= 1:
        for j in range(lengths[0] if lengths else 0):
            state.append(torch.tensor([t[j] for t in tokens], dtype=torch.long))
        return state
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(n, []).append(i)
    merged: TokenState | None = None
    order: list[int] = []
    for n, idx in groups.items():
        part = state.select(idx)
        for j in range(n):
            part.append(torch.tensor([tokens[i][j] for i in idx], dtype=torch.long))
        merged = part if merged is None else merged.concat(part)
        order.extend(idx)
    assert merged is not None
    return merged.select(torch.argsort(torch.tensor(order)))
