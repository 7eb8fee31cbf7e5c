"""Layer descriptions: what a decoder block consists of, for backends that fuse ``decoder_stack``.

These frozen dataclasses are the contract between the core's blocks and any backend whose
``decoder_stack`` runs the blocks its own way (pace-avx512's C++ loop). The block classes of
``pace_core.models.layers`` are private to the core and may change; every block handed to a
``decoder_stack`` prepare step has ``describe() -> BlockSpec``, and a fusing backend reads
only the descriptions below.

A description names the kernels the core bound at build time (``fn``) and their prepared
``weight`` (in the layout of the backend that prepared it): a fusing backend first checks
that they are its own kernels, then reads its own prepared weights. Running a block equals,
with ``r`` the residual and ``attn``/``mlp`` as described by their specs::

    pre_norm:   h, r = norms[0](x, r); h, r = norms[1](attn(h), r); x = mlp(h)
    sandwich:   h, r = norms[0](x, r); h = norms[1](attn(h))[0]; h, r = norms[2](h, r)
                x = norms[3](mlp(h))[0]
    parallel:   h, r = norms[0](x, r); x = attn(h) + mlp(h)
    post_norm:  x = x + r (if any); h = norms[0](attn(x), x)[0]; x = norms[1](mlp(h), h)[0]
                r = None
    opaque:     only the block's own code runs it (no norms, attention None; mlp describes
                its dense MLP only): Gemma 4's per-layer inputs, layer scalar, KV reuse, MoE

and attention is: ``q, k, v = qkv(h)`` as ``[B, T, heads, head_dim]``; ``q_norm``/``k_norm``
(no residual); ``rope`` (before the norms when ``norms_after_rope``); queries times
``temperature.scales(positions)`` when set; ``v_norm`` on the values; ``k, v`` written to
the cache at ``layer``; ``attend`` with ``scale``, ``sinks`` and ``window``; ``o_proj`` of the
heads concatenated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from pace_core.caches.base import Window

Kernel = Callable[..., Any]

# What ``BlockSpec.kind`` may be (see the module doc for what each one runs).
BLOCK_KINDS: tuple[str, ...] = ("pre_norm", "sandwich", "parallel", "post_norm", "opaque")


class BoundKernel(Protocol):
    """A kernel bound to its prepared weight: calling it is ``fn(x, weight)``."""

    fn: Kernel
    weight: Any


@dataclass(frozen=True)
class NormSpec:
    """``norm(x, residual) -> (y, x + residual)`` by the ``op`` kernel ``fn``."""

    op: str  # "rms_norm" or "layer_norm"
    fn: Kernel
    weight: torch.Tensor  # fp32 [H] (Gemma's 1 + w folded in)
    eps: float
    bias: torch.Tensor | None = None  # layer_norm only


@dataclass(frozen=True)
class RopeSpec:
    fn: Kernel  # the ``rope`` kernel
    rotary: Any  # the step's (cos, sin) of this layer are ``step.rope[id(rotary)]``
    interleaved: bool  # GPT-J pairs, else neox halves


@dataclass(frozen=True)
class TemperatureTuning:
    """Llama 4's attention temperature on NoPE layers: queries at position ``p`` are scaled by
    ``1 + attn_scale * log1p(floor((p + 1) / floor_scale))`` (1 below ``floor_scale``)."""

    attn_scale: float
    floor_scale: float

    def scales(self, positions: torch.Tensor) -> torch.Tensor:
        """fp32 factors ``[B, T]`` for integer ``positions [B, T]``."""
        steps = torch.floor((positions.float() + 1.0) / self.floor_scale)
        return torch.log1p(steps) * self.attn_scale + 1.0


@dataclass(frozen=True)
class AttentionSpec:
    layer: int  # the KV cache layer it writes and reads
    qkv: BoundKernel  # op ``qkv_proj``: q, k, v of num_heads / num_kv_heads * head_dim columns
    o_proj: BoundKernel  # op ``linear``
    attend: Kernel  # op ``attention``
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    window: Window  # sliding (int), chunked, or None; the step's mask is ``meta.mask(window)``
    sinks: torch.Tensor | None  # fp32 [num_heads] sink logits
    q_norm: NormSpec | None
    k_norm: NormSpec | None
    rope: RopeSpec | None
    norms_after_rope: bool = False  # Llama 4: rope first, then the (weightless) QK-norms
    temperature: TemperatureTuning | None = None
    v_norm: NormSpec | None = None  # Gemma 4: over each value head before caching


@dataclass(frozen=True)
class LatentAttentionSpec:
    """Multi-head latent attention (DeepSeek MLA) over a latent cache: queries ``q(h)``
    ``[B, T, heads, nope + rope_dim]``; ``kv_a(h)`` = ``[latent (rank) | k_pe (rope_dim)]``,
    the latent through ``kv_norm``; rope on the queries' and ``k_pe``'s last ``rope_dim``;
    the queries' first ``nope`` dims absorbed into the latent space by ``w_uk`` ``[heads, nope,
    rank]``; ``[latent | k_pe]`` cached at ``layer`` (one KV head, no values); ``attend`` (op
    ``latent_attention``) with ``scale``; the latent outputs through ``w_uv`` ``[heads,
    v_dim, rank]``; ``o_proj`` of the heads concatenated."""

    layer: int
    q: Callable[[torch.Tensor], torch.Tensor]
    kv_a: BoundKernel
    kv_norm: NormSpec
    w_uk: torch.Tensor
    w_uv: torch.Tensor
    o_proj: BoundKernel
    attend: Kernel
    num_heads: int
    nope: int
    rope_dim: int
    rank: int
    v_dim: int
    scale: float
    rope: RopeSpec


@dataclass(frozen=True)
class GatedMLPSpec:
    """``act(x @ gate) * (x @ up) @ down`` by one ``gated_mlp`` kernel."""

    kernel: BoundKernel
    activation: str  # a name of pace_core.ops.ACTIVATIONS
    hidden: int
    intermediate: int


@dataclass(frozen=True)
class DenseMLPSpec:
    """``fc2(act(fc1(x)))`` by two ``linear`` kernels."""

    fc1: BoundKernel
    fc2: BoundKernel
    activation: str  # a name of pace_core.ops.ACTIVATIONS


@dataclass(frozen=True)
class Routing:
    """How router logits choose ``top_k`` experts and weigh them (the kinds and their math:
    :mod:`pace_core.models.moe`)."""

    kind: str  # topk_softmax | softmax_topk | topk_sigmoid | grouped_sigmoid
    top_k: int
    normalize: bool = False  # renormalise the chosen weights to sum 1
    scale: float = 1.0  # then multiply them by this (DeepSeek's routed_scaling_factor)
    groups: int = 1  # grouped_sigmoid: contiguous expert groups ...
    top_groups: int = 1  # ... of which the best this many are eligible
    choice_bias: torch.Tensor | None = None  # grouped_sigmoid: fp32 [E] added for the choice
    expert_scales: torch.Tensor | None = None  # [E]: each chosen weight times its expert's
    fp32_weights: bool = False  # keep the weights fp32 (else the router's dtype), as HF does


@dataclass(frozen=True)
class MoESpec:
    """Routed experts (op ``moe``) under ``routing``, plus a ``shared`` expert on every token
    when set; ``scale_input``: each expert sees its input times its weight (Llama 4) instead of
    its output being weighed."""

    router: BoundKernel  # op ``linear``: expert logits
    experts: BoundKernel  # op ``moe``
    routing: Routing
    shared: Callable[[torch.Tensor], torch.Tensor] | None = None
    scale_input: bool = False


@dataclass(frozen=True)
class OpaqueMLP:
    """An MLP no description covers (a family's own callable): ``fn(h)``."""

    fn: Callable[[torch.Tensor], torch.Tensor]


MLPSpec = GatedMLPSpec | DenseMLPSpec | MoESpec | OpaqueMLP


@dataclass(frozen=True)
class BlockSpec:
    kind: str  # one of BLOCK_KINDS
    norms: tuple[NormSpec, ...]  # in the order the module doc uses them
    attention: AttentionSpec | LatentAttentionSpec | None  # None for opaque blocks
    mlp: MLPSpec
