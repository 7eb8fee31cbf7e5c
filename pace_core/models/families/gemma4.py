"""Gemma 4 (text): Gemma 3's sandwich norms and local/global layers, with

* plain-weight RMSNorms (no ``1 + w``), attention scale 1, a weightless RMSNorm on each value
  head; global layers with their own head size and KV heads (``config.per_layer_config``),
  "proportional" rope (a ``partial_rotary_factor`` share of the frequencies, the rest
  identity), and
  with ``attention_k_eq_v`` values taken from the key projection;
* KV sharing: the last ``num_kv_shared_layers`` layers compute queries only and attend over
  the keys/values the last earlier layer of their type cached this step (no cache of their
  own; their MLP is twice as wide with ``use_double_wide_mlp``);
* per-layer inputs (PLE, ``hidden_size_per_layer_input``): a per-token, per-layer embedding
  plus a projection of the embeddings, gated into the residual stream after each MLP;
* an optional MoE block beside the dense MLP (softmax routing over normalised, scaled inputs,
  renormalised top-k weights times a per-expert scale, GeGLU experts);
* ``layer_scalar``: each layer's output stream is scaled.

A layer runs as one opaque block (``pace_core.stack_spec``: the fused stacks do not cover it).
``build_conditional`` loads the text part of a ``Gemma4ForConditionalGeneration`` checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from pace_core.errors import ModelLoadError
from pace_core.models import common
from pace_core.models.builder import ModelBuilder
from pace_core.models.decoder import DecoderLM
from pace_core.models.layers import (
    TORCH_ACTIVATIONS,
    Attention,
    Bound,
    Kernel,
    Norm,
    StepContext,
    describe_mlp,
)
from pace_core.models.moe import MoE, Routing, bind_experts, expert_tensors
from pace_core.models.rope import Rotary
from pace_core.stack_spec import BlockSpec

SLIDING = "sliding_attention"
_KV_WEIGHTS = ("k_proj", "v_proj", "k_norm", "v_norm")  # unused by a KV-sharing layer


@dataclass
class ReusedKVAttention:
    """A KV-sharing layer: its own queries over the cache view ``source`` wrote this step."""

    q_proj: Bound
    q_norm: Norm
    o_proj: Bound
    attend: Kernel
    rope_fn: Kernel
    rotary: Rotary
    source: int  # the cache layer whose keys and values it reads
    num_heads: int
    head_dim: int
    window: int | None

    def __call__(self, x: torch.Tensor, step: StepContext) -> torch.Tensor:
        b, t, _ = x.shape  # t: the step's positions, or its last one (Gemma4Block)
        q = self.q_norm(self.q_proj(x).view(b, t, self.num_heads, self.head_dim))[0]
        cos, sin = (table[:, -t:] for table in step.rope[id(self.rotary)])
        q, _ = self.rope_fn(q, q[:, :, :0], cos, sin, self.rotary.interleaved)
        view = step.views[self.source]
        if t < view.meta.width:
            view = _LastQueries(view, t)
        out = self.attend(q.transpose(1, 2), view, 1.0, None, self.window)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class _LastQueries:
    """A cache view whose step mask keeps only the last ``t`` query positions."""

    def __init__(self, view: Any, t: int) -> None:
        self._view, self.meta = view, _LastQueryMeta(view.meta, t)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._view, name)


class _LastQueryMeta:
    def __init__(self, meta: Any, t: int) -> None:
        self._meta, self._t = meta, t

    def mask(self, window: Any) -> torch.Tensor:
        return self._meta.mask(window)[:, :, -self._t :]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._meta, name)


@dataclass(frozen=True)
class ScaledRouterWeight:
    norm: Norm  # weightless RMSNorm over the hidden size
    scale: torch.Tensor  # [H] router.scale
    root: float  # hidden_size ** -0.5
    proj: Bound  # [E, H]


def scaled_router(x: torch.Tensor, w: ScaledRouterWeight) -> torch.Tensor:
    """Gemma 4's expert logits: ``proj(norm(x) * scale * hidden ** -0.5)``."""
    return w.proj(w.norm(x)[0] * w.scale * w.root)


class PerLayerInputs:
    """PLE: ``(norm(proj(x) / sqrt(H)) + table[ids] * sqrt(P)) / sqrt(2)`` as ``[B, T, L, P]``."""

    __slots__ = ("layers", "norm", "proj", "size", "table", "to_hidden")

    def __init__(self, table: Bound, proj: Bound, norm: Norm, layers: int, size: int, hidden: int):
        self.table, self.proj, self.norm = table, proj, norm
        self.layers, self.size, self.to_hidden = layers, size, hidden**-0.5

    def __call__(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        shape = (*ids.shape, self.layers, self.size)
        tokens = self.table(ids) * torch.tensor(self.size**0.5, dtype=x.dtype)
        context = self.norm((self.proj(x) * self.to_hidden).reshape(shape))[0]
        return (context + tokens.reshape(shape)) * 2.0**-0.5


class Gemma4Block:
    """One Gemma 4 layer (the module doc); hidden states travel without a separate residual."""

    kind = "opaque"

    def __init__(self, index: int, norms: dict[str, Norm], attn: Any, mlp: Bound,
                 moe: MoE | None, ple: tuple[Bound, Bound] | None, activation: str,
                 scalar: torch.Tensor | None, first_shared: bool) -> None:  # fmt: skip
        self.index, self.norms, self.attn, self.mlp, self.moe = index, norms, attn, mlp, moe
        self.ple, self.act, self.scalar = ple, TORCH_ACTIVATIONS[activation], scalar
        # the first KV-sharing layer: from here on no layer writes the cache, so when only the
        # last position's output is used (not scoring, not verifying drafts) the layers compute
        # that position alone (as transformers does)
        self.first_shared = first_shared

    def _norm(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return self.norms[name](x)[0]

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        out = self.mlp(self._norm("pre_feedforward_layernorm", x))
        if self.moe is None:
            return out
        flat = x.reshape(-1, x.shape[-1])
        chosen, weights = self.moe.route(flat)
        experts = self.moe.experts
        routed = experts.fn(self._norm("pre_feedforward_layernorm_2", flat), chosen, weights,
                            experts.weight).view(x.shape)  # fmt: skip
        return self._norm("post_feedforward_layernorm_1", out) + self._norm(
            "post_feedforward_layernorm_2", routed
        )

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None, step: StepContext):
        if residual is not None:
            x = x + residual
        if self.first_shared and step.last_only and x.shape[1] > 1:
            x = x[:, -1:]
        h = self.attn(self._norm("input_layernorm", x), step)
        x = x + self._norm("post_attention_layernorm", h)
        x = x + self._norm("post_feedforward_layernorm", self._ffn(x))
        if self.ple is not None:
            gate, proj = self.ple
            h = self.act(gate(x)) * step.per_layer[:, -x.shape[1] :, self.index]
            x = x + self._norm("post_per_layer_input_norm", proj(h))
        if self.scalar is not None:
            x = x * self.scalar
        return x, None

    def describe(self) -> BlockSpec:
        return BlockSpec(self.kind, (), None, describe_mlp(self.mlp))


def _rotaries(cfg: Any) -> dict[str, Rotary]:
    """One rope per layer type, each with its own head size (proportional rope on globals)."""
    return {
        t: Rotary(cfg.per_layer_config[t], cfg.per_layer_config[t].head_dim, layer_type=t)
        for t in sorted(set(cfg.layer_types))
    }


def _router(b: ModelBuilder, prefix: str) -> Bound:
    cfg = b.config
    weight = ScaledRouterWeight(
        b.unit_norm(cfg.hidden_size, cfg.rms_norm_eps),
        b.tensor(f"{prefix}.scale"),
        cfg.hidden_size**-0.5,
        b.linear(f"{prefix}.proj", keep_format=True),
    )
    return Bound(scaled_router, weight)


def _moe(b: ModelBuilder, prefix: str) -> MoE:
    cfg = b.config
    experts = cfg.num_experts
    gate_up, down = expert_tensors(b, f"{prefix}.experts", experts)
    act = common.activation(cfg.hidden_activation)
    routing = Routing(
        "softmax_topk", cfg.top_k_experts, normalize=True, fp32_weights=True,
        expert_scales=b.tensor(f"{prefix}.router.per_expert_scale", torch.float32),
    )  # fmt: skip
    return MoE(
        _router(b, f"{prefix}.router"),
        bind_experts(
            b, gate_up, down, module=f"{prefix}.experts", top_k=cfg.top_k_experts, activation=act
        ),
        routing,
        num_experts=experts,
    )


def build(b: ModelBuilder) -> DecoderLM:
    cfg = b.config
    if getattr(cfg, "use_bidirectional_attention", None) == "all":
        raise ModelLoadError("Gemma 4 with use_bidirectional_attention='all' is not causal")
    rotaries = _rotaries(cfg)
    embed = common.embedding(b, "model.embed_tokens.weight")
    head = common.lm_head(b, cfg, embed)  # next to the table it may share: one copy at a time
    caches = _CacheLayers()
    layers = [
        _block(b, i, _attention(b, i, rotaries, caches)) for i in range(cfg.num_hidden_layers)
    ]
    return common.assemble(
        b,
        cfg,
        embed=embed,
        layers=layers,
        final_norm=b.norm("model.norm", cfg.rms_norm_eps),
        head=head,
        rotaries=list(rotaries.values()),
        windows=[cfg.sliding_window if t == SLIDING else None for t in cfg.layer_types],
        cache_layers=caches.dims,
        embed_scale=cfg.hidden_size**0.5,
        logit_softcap=getattr(cfg, "final_logit_softcapping", None),
        per_layer_inputs=_per_layer_inputs(b),
    )


@dataclass
class _CacheLayers:
    """The cache layers a build allocates, and the last one each layer type wrote."""

    dims: list[tuple[int, int, int]] = field(default_factory=list)  # (KV heads, key, value)
    last: dict[str, int] = field(default_factory=dict)


def _attention(
    b: ModelBuilder, i: int, rotaries: dict[str, Rotary], caches: _CacheLayers
) -> Attention | ReusedKVAttention:
    """Layer ``i``'s attention: its own cache layer, or (KV sharing) the last one of its type."""
    cfg = b.config
    kind, a, eps = cfg.layer_types[i], f"model.layers.{i}.self_attn", cfg.rms_norm_eps
    hd, kv = cfg.per_layer_config[i].head_dim, cfg.per_layer_config[i].num_key_value_heads
    heads, window = cfg.num_attention_heads, cfg.sliding_window if kind == SLIDING else None
    o_proj = b.linear(f"{a}.o_proj", bias=cfg.attention_bias)
    if cfg.kv_sharing_modes[i] == "reuse":
        for name in _KV_WEIGHTS:  # checkpoints may carry them; transformers ignores them too
            if b.weights.has(f"{a}.{name}.weight"):
                b.weights.discard(f"{a}.{name}.weight")
        attend = b.kernel("attention", head_dim=hd, gqa=heads // kv, window=window, sinks=False,
                          cache_layout=b.cache_layout)  # fmt: skip
        return ReusedKVAttention(
            b.linear(f"{a}.q_proj", bias=cfg.attention_bias), b.norm(f"{a}.q_norm", eps), o_proj,
            attend.fn, b.kernel("rope", head_dim=hd).fn, rotaries[kind], caches.last[kind],
            heads, hd, window,
        )  # fmt: skip
    values = "k_proj" if cfg.attention_k_eq_v and kind != SLIDING else "v_proj"
    caches.last[kind] = len(caches.dims)
    caches.dims.append((kv, hd, hd))
    return b.attention(
        layer=caches.last[kind], o_proj=o_proj, rotary=rotaries[kind], num_heads=heads,
        num_kv_heads=kv, head_dim=hd, scale=1.0, window=window,
        qkv=b.qkv([f"{a}.q_proj", f"{a}.k_proj", f"{a}.{values}"], bias=cfg.attention_bias),
        q_norm=b.norm(f"{a}.q_norm", eps), k_norm=b.norm(f"{a}.k_norm", eps),
        v_norm=b.unit_norm(hd, eps),
    )  # fmt: skip


def _block(b: ModelBuilder, i: int, attn: Any) -> Gemma4Block:
    cfg = b.config
    p = f"model.layers.{i}"
    names = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
             "post_feedforward_layernorm"]  # fmt: skip
    if cfg.enable_moe_block:
        names += ["pre_feedforward_layernorm_2", "post_feedforward_layernorm_1",
                  "post_feedforward_layernorm_2"]  # fmt: skip
    ple = None
    if cfg.hidden_size_per_layer_input:
        names.append("post_per_layer_input_norm")
        ple = (b.linear(f"{p}.per_layer_input_gate"), b.linear(f"{p}.per_layer_projection"))
    scalar = b.tensor(f"{p}.layer_scalar") if b.weights.has(f"{p}.layer_scalar") else None
    return Gemma4Block(
        i,
        {n: b.norm(f"{p}.{n}", cfg.rms_norm_eps) for n in names},
        attn,
        common.gated_mlp(b, f"{p}.mlp", cfg.hidden_activation),
        _moe(b, p) if cfg.enable_moe_block else None,
        ple,
        common.activation(cfg.hidden_activation),
        scalar,
        i == cfg.num_hidden_layers - cfg.num_kv_shared_layers and cfg.num_kv_shared_layers > 0,
    )


def _per_layer_inputs(b: ModelBuilder) -> PerLayerInputs | None:
    cfg = b.config
    size = cfg.hidden_size_per_layer_input
    if not size:
        return None
    return PerLayerInputs(
        common.embedding(b, "model.embed_tokens_per_layer.weight"),
        b.linear("model.per_layer_model_projection"),
        b.norm("model.per_layer_projection_norm", cfg.rms_norm_eps),
        cfg.num_hidden_layers,
        size,
        cfg.hidden_size,
    )


def build_conditional(b: ModelBuilder) -> DecoderLM:
    return common.build_text_part(b, build)


build_conditional.harmless_extras = (
    r"model\.(vision_tower|audio_tower|embed_vision|embed_audio)\..*",
)
