"""Qwen3-MoE: Qwen3 attention (QK-norm) with top-k routed SwiGLU experts (softmax over every
expert, top-k, renormalised when ``norm_topk_prob``); a layer is dense when listed in
``mlp_only_layers`` or off the ``decoder_sparse_step`` grid. Experts load from per-expert
tensors (``mlp.experts.{e}.{gate,up,down}_proj.weight``, as checkpoints store them) or from
the fused ``mlp.experts.gate_up_proj`` / ``down_proj`` of transformers 5."""

from __future__ import annotations

from pace_core.models.builder import ModelBuilder
from pace_core.models.decoder import DecoderLM
from pace_core.models.families import llama, qwen3
from pace_core.models.layers import Bound
from pace_core.models.moe import MoE, Routing, bind_experts, expert_tensors, layer_of


def is_sparse(config, layer: int) -> bool:
    """transformers' rule for which layers route to experts."""
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return (
        layer not in (getattr(config, "mlp_only_layers", None) or [])
        and config.num_experts > 0
        and (layer + 1) % step == 0
    )


def mlp(b: ModelBuilder, prefix: str) -> MoE | Bound:
    """The layer's routed experts, or its dense gated MLP."""
    cfg = b.config
    if not is_sparse(cfg, layer_of(prefix)):
        return llama.separate_gated_mlp(b, prefix)
    if cfg.hidden_act not in ("silu", "swish"):
        raise ValueError(f"Qwen3-MoE experts with hidden_act {cfg.hidden_act!r} are not supported")
    gate_up, down = expert_tensors(b, f"{prefix}.experts", cfg.num_experts)
    experts = bind_experts(
        b, gate_up, down, module=f"{prefix}.experts", top_k=cfg.num_experts_per_tok
    )
    router = b.linear(f"{prefix}.gate", bias=False, keep_format=True)
    routing = Routing("softmax_topk", cfg.num_experts_per_tok, normalize=cfg.norm_topk_prob)
    return MoE(router, experts, routing, num_experts=cfg.num_experts)


def build(b: ModelBuilder) -> DecoderLM:
    return llama.build(b, mlp=mlp, attention_extra=qwen3.qk_norms)
