"""GPT-OSS: attention with sinks and per-layer sliding window, top-k routed MoE with clamped
SwiGLU experts; MXFP4 expert weights are de-quantized at load."""

from __future__ import annotations

import torch

from pace_core.models import common
from pace_core.models.decoder import DecoderLM, ModelBuilder
from pace_core.models.layers import Bound, PreNormBlock
from pace_core.models.mxfp4 import dequantize_mxfp4


class MoE:
    """Router (linear + top-k + softmax over the chosen logits) feeding the ``moe`` kernel."""

    __slots__ = ("experts", "router", "top_k")

    def __init__(self, router: Bound, experts: Bound, top_k: int) -> None:
        self.router, self.experts, self.top_k = router, experts, top_k

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        top, chosen = torch.topk(self.router(flat), self.top_k, dim=-1)
        weights = torch.softmax(top, dim=-1)
        return self.experts.fn(flat, chosen, weights, self.experts.weight).view(shape)


def _expert_tensor(b: ModelBuilder, name: str) -> torch.Tensor:
    """A dense expert tensor, de-quantizing ``{name}_blocks``/``_scales`` when stored as MXFP4."""
    if b.weights.has(f"{name}_blocks"):
        blocks = b.weights.take(f"{name}_blocks")
        scales = b.weights.take(f"{name}_scales")
        return dequantize_mxfp4(blocks, scales, b.dtype)
    return b.tensor(name)


def build(b: ModelBuilder) -> DecoderLM:
    cfg = b.config
    eps = cfg.rms_norm_eps
    rotary = common.rotaries_by_type(cfg, common.heads(cfg)[2])[None]
    embed, embed_weight = common.embedding(b, "model.embed_tokens.weight")
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        attn = common.self_attention(
            b,
            cfg,
            i,
            f"{p}.self_attn",
            rotary=rotary,
            bias=cfg.attention_bias,
            o_bias=cfg.attention_bias,
            sinks=b.tensor(f"{p}.self_attn.sinks", torch.float32),
        )
        attrs = {"experts": cfg.num_local_experts, "top_k": cfg.num_experts_per_tok}
        experts = b.bind(
            "moe",
            attrs,
            _expert_tensor(b, f"{p}.mlp.experts.gate_up_proj"),
            b.tensor(f"{p}.mlp.experts.gate_up_proj_bias"),
            _expert_tensor(b, f"{p}.mlp.experts.down_proj"),
            b.tensor(f"{p}.mlp.experts.down_proj_bias"),
            getattr(cfg, "swiglu_alpha", 1.702),
            cfg.swiglu_limit,
        )
        mlp = MoE(b.linear(f"{p}.mlp.router", bias=True), experts, cfg.num_experts_per_tok)
        norm1 = b.norm(f"{p}.input_layernorm", eps)
        norm2 = b.norm(f"{p}.post_attention_layernorm", eps)
        layers.append(PreNormBlock(norm1, attn, norm2, mlp))
    return common.assemble(
        b,
        cfg,
        embed=embed,
        layers=layers,
        final_norm=b.norm("model.norm", eps),
        head=common.lm_head(b, cfg, embed_weight),
        rotaries=[rotary],
    )
