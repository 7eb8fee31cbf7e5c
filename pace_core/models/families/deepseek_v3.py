"""DeepSeek-V3 / R1: multi-head latent attention over a latent KV cache (:mod:`pace_core.models.
mla`; low-rank queries when ``q_lora_rank``, decoupled rope on ``qk_rope_head_dim`` dims, yarn
``mscale_all_dim`` folded into the softmax scale), the first ``first_k_dense_replace`` layers
dense, the others MoE: sigmoid routing limited to the best ``topk_group`` of ``n_group``
expert groups (a choice bias ``e_score_correction_bias``), renormalised and scaled by
``routed_scaling_factor``, plus shared experts; the router runs in fp32 as in transformers."""

from __future__ import annotations

import math

import torch

from pace_core.errors import ModelLoadError
from pace_core.models import common
from pace_core.models.builder import ModelBuilder
from pace_core.models.decoder import DecoderLM
from pace_core.models.families import llama
from pace_core.models.layers import Bound
from pace_core.models.mla import LatentAttention, LowRankQuery
from pace_core.models.moe import MoE, Routing, bind_experts, expert_tensors, fp32_router, layer_of
from pace_core.models.rope import Rotary, rope_parameters

LATENT_NORM_EPS = 1e-6  # q_a_layernorm / kv_a_layernorm (transformers' default, not the config's)


def softmax_scale(cfg) -> float:
    """``qk_head_dim ** -0.5``, times yarn's ``mscale(factor, mscale_all_dim) ** 2``."""
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    params = rope_parameters(cfg, None)
    all_dim = params.get("mscale_all_dim", 0)
    if params["rope_type"] != "default" and all_dim and params["factor"] > 1:
        mscale = 0.1 * all_dim * math.log(params["factor"]) + 1.0
        scale *= mscale * mscale
    return scale


def attention(b: ModelBuilder, layer: int, prefix: str, rotary: Rotary) -> LatentAttention:
    cfg = b.config
    heads, nope, rope_dim = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
    rank, v_dim, bias = cfg.kv_lora_rank, cfg.v_head_dim, cfg.attention_bias
    if cfg.q_lora_rank:
        q = LowRankQuery(
            b.linear(f"{prefix}.q_a_proj", bias=bias),
            b.norm(f"{prefix}.q_a_layernorm", LATENT_NORM_EPS),
            b.linear(f"{prefix}.q_b_proj"),
        )
    else:
        q = b.linear(f"{prefix}.q_proj")
    expand = b.tensor(f"{prefix}.kv_b_proj.weight").view(heads, nope + v_dim, rank)
    attend = b.kernel(
        "latent_attention", rank=rank, rope_dim=rope_dim, heads=heads, window=None,
        cache_layout=b.cache_layout,
    )  # fmt: skip
    return LatentAttention(
        layer=layer,
        q=q,
        kv_a=b.linear(f"{prefix}.kv_a_proj_with_mqa", bias=bias),
        kv_norm=b.norm(f"{prefix}.kv_a_layernorm", LATENT_NORM_EPS),
        w_uk=expand[:, :nope].contiguous(),
        w_uv=expand[:, nope:].contiguous(),
        o_proj=b.linear(f"{prefix}.o_proj", bias=bias),
        attend=attend.fn,
        rope_fn=b.kernel("rope", head_dim=rope_dim).fn,
        rotary=rotary,
        num_heads=heads,
        nope=nope,
        rope_dim=rope_dim,
        scale=softmax_scale(cfg),
    )


def mlp(b: ModelBuilder, prefix: str) -> MoE | Bound:
    cfg = b.config
    if layer_of(prefix) < cfg.first_k_dense_replace:
        return llama.separate_gated_mlp(b, prefix)
    if cfg.hidden_act not in ("silu", "swish"):
        raise ValueError(f"DeepSeek experts with hidden_act {cfg.hidden_act!r} are not supported")
    experts = cfg.n_routed_experts
    gate_up, down = expert_tensors(b, f"{prefix}.experts", experts)
    routing = Routing(
        "grouped_sigmoid",
        cfg.num_experts_per_tok,
        normalize=cfg.norm_topk_prob,
        scale=float(cfg.routed_scaling_factor),
        groups=cfg.n_group,
        top_groups=cfg.topk_group,
        choice_bias=b.tensor(f"{prefix}.gate.e_score_correction_bias", torch.float32),
        fp32_weights=True,
    )
    shared = None
    if cfg.n_shared_experts:
        shared = llama.separate_gated_mlp(b, f"{prefix}.shared_experts")
    return MoE(
        Bound(fp32_router, b.tensor(f"{prefix}.gate.weight", torch.float32)),
        bind_experts(
            b, gate_up, down, module=f"{prefix}.experts", top_k=cfg.num_experts_per_tok
        ),
        routing,
        num_experts=experts,
        shared=shared,
    )


def build(b: ModelBuilder) -> DecoderLM:
    cfg = b.config
    qc = getattr(cfg, "quantization_config", None)
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    if method not in (None, "pace"):
        raise ModelLoadError(
            f"DeepSeek checkpoint quantized as {method!r} (the released V3/R1 weights are FP8): "
            "pace loads bf16/fp32 checkpoints (convert first) and quantizes on load"
        )
    _drop_prediction_layers(b)
    eps = cfg.rms_norm_eps
    rotary = Rotary(cfg, cfg.qk_rope_head_dim, interleaved=bool(cfg.rope_interleave))
    embed = common.embedding(b, "model.embed_tokens.weight")
    head = common.lm_head(b, cfg, embed)  # next to the table it may share: one copy at a time
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        attn = attention(b, i, f"{p}.self_attn", rotary)
        layers.append(common.pre_norm_block(b, p, attn, mlp(b, f"{p}.mlp")))
    return common.assemble(
        b,
        cfg,
        embed=embed,
        layers=layers,
        final_norm=b.norm("model.norm", eps),
        head=head,
        rotaries=[rotary],
        windows=[None] * cfg.num_hidden_layers,
        cache_layers=[(1, cfg.kv_lora_rank + cfg.qk_rope_head_dim, 0)] * len(layers),
    )


def _drop_prediction_layers(b: ModelBuilder) -> None:
    """The multi-token-prediction layers released checkpoints carry past the decoder's
    ``num_hidden_layers`` (transformers ignores them too)."""
    for name in b.weights.names():
        if name.startswith("model.layers.") and layer_of(name) >= b.config.num_hidden_layers:
            b.weights.discard(name)
