"""The decoder-only LM shared by all families: the forward pass over the built blocks.

Building one (reading weights, resolving and binding kernels) is :mod:`pace_core.models.builder`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pace_core.binder import OpPlan
from pace_core.caches.base import StepMeta, Window
from pace_core.models.layers import Bound, Norm, StepContext
from pace_core.models.rope import Rotary


@dataclass
class DecoderLM:
    """Embeddings → decoder blocks → final norm → lm_head, for any family."""

    config: Any
    dtype: torch.dtype
    embed: Callable[[torch.Tensor], torch.Tensor]
    layers: list[Callable]
    stack: Bound  # the decoder_stack kernel bound to ``layers``
    final_norm: Norm | None
    lm_head: Bound
    rotaries: list[Rotary]
    windows: set[Window]
    num_layers: int
    num_kv_heads: list[int]
    head_dims: list[int]
    vocab_size: int
    plan: OpPlan
    value_dims: list[int] | None = None  # per-layer value dims where they differ from keys'
    embed_scale: float | None = None
    position_embed: Callable[[torch.Tensor], torch.Tensor] | None = None
    project_in: Bound | None = None
    project_out: Bound | None = None
    logit_softcap: float | None = None
    # (ids, scaled embeddings) -> [B, T, layers, P] inputs each layer reads (Gemma 4's PLE)
    per_layer_inputs: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    @property
    def reprefill_at(self) -> int | None:
        """Cache length at which LongRoPE models recompute all keys with the long factors."""
        for rot in self.rotaries:
            if rot.rope_type == "longrope":
                return int(rot.original_max)
        return None

    @property
    def packs_ragged_steps(self) -> bool:
        """Whether the bound decoder stack computes only the real tokens of a ragged step, so
        prefill chunks and single-token decodes can share one forward at no padding cost."""
        return any(r.kernel.packs_ragged for r in self.plan.resolutions if r.op == "decoder_stack")

    def make_step(self, cache: Any, meta: StepMeta) -> StepContext:
        """Positions and rope tables for the new tokens described by ``meta``."""
        positions = meta.positions()
        step = StepContext(cache, positions, meta=meta)
        for rot in self.rotaries:
            step.rope[id(rot)] = rot.tables(positions, self.dtype, below=meta.max_len)
        return step

    def forward(
        self, ids: torch.Tensor, step: StepContext, *, all_logits: bool = False
    ) -> torch.Tensor:
        """Logits ``[B, V]`` for the last position, or ``[B, T, V]`` with ``all_logits``."""
        logits = self.head(self.hidden_states(ids, step, last_only=not all_logits))
        return logits if all_logits else logits[:, 0]

    def hidden_states(
        self, ids: torch.Tensor, step: StepContext, *, last_only: bool = False
    ) -> torch.Tensor:
        """The states the LM head reads (after the final norm; transformers'
        ``last_hidden_state``): ``[B, T, H]``, or ``[B, 1, H]`` with ``last_only``."""
        step.last_only = last_only
        x = self.embed(ids)
        if self.embed_scale is not None:
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        if self.per_layer_inputs is not None:
            step.per_layer = self.per_layer_inputs(ids, x)
        if self.project_in is not None:
            x = self.project_in(x)
        if self.position_embed is not None:
            x = x + self.position_embed(step.positions)
        x, residual = self.stack.fn(x, None, step, self.stack.weight)
        if last_only:
            x = x[:, -1:]
            residual = None if residual is None else residual[:, -1:]
        if self.final_norm is not None:
            x = self.final_norm(x, residual)[0]
        elif residual is not None:
            x = x + residual
        if self.project_out is not None:
            x = self.project_out(x)
        return x

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits of ``hidden`` states (the LM head and any soft-capping)."""
        logits = self.lm_head(hidden).float()
        if self.logit_softcap:
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        return logits


def left_pad(prompts: Sequence[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D prompts into ``ids [B, T]`` and ``valid [B, T]`` with padding on the left."""
    width = max(int(p.numel()) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(prompts), width), dtype=torch.bool)
    for i, p in enumerate(prompts):
        if p.numel():
            ids[i, width - p.numel() :] = p
            valid[i, width - p.numel() :] = True
    return ids, valid


def forward_step(
    model: DecoderLM,
    cache: Any,
    seq_ids: list[int],
    ids: torch.Tensor,
    num_new: Sequence[int],
    *,
    all_logits: bool = False,
) -> torch.Tensor:
    """One forward pass adding ``num_new[b]`` real (right-aligned) tokens of ``ids`` per row
    to ``cache``'s sequences ``seq_ids``; logits of each row's last position (``[B, V]``) or of
    every position (``[B, T, V]``)."""
    meta = cache.begin_step(seq_ids, list(num_new), ids.shape[1])
    logits = model.forward(ids, model.make_step(cache, meta), all_logits=all_logits)
    cache.end_step()
    return logits


def hidden_step(
    model: DecoderLM, cache: Any, seq_ids: list[int], ids: torch.Tensor, num_new: Sequence[int]
) -> torch.Tensor:
    """:func:`forward_step` returning the hidden states of every position ``[B, T, H]``
    (what embeddings pool) instead of logits."""
    meta = cache.begin_step(seq_ids, list(num_new), ids.shape[1])
    hidden = model.hidden_states(ids, model.make_step(cache, meta))
    cache.end_step()
    return hidden


def prefill(
    model: DecoderLM,
    cache: Any,
    seq_ids: list[int],
    prompts: Sequence[torch.Tensor],
    *,
    all_logits: bool = False,
) -> torch.Tensor:
    """Add whole prompts (left-padded into one forward) to empty sequences."""
    ids, _ = left_pad(prompts)
    return forward_step(
        model, cache, seq_ids, ids, [p.numel() for p in prompts], all_logits=all_logits
    )


def score(model: DecoderLM, cache: Any, prompts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Logits ``[B, T, V]`` for every position of left-padded prompts (prompt logprobs)."""
    seq_ids = cache.add_sequences(len(prompts))
    logits = prefill(model, cache, seq_ids, prompts, all_logits=True)
    cache.retain([])
    return logits
