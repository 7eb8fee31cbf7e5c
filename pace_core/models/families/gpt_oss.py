"""GPT-OSS: attention with sinks and per-layer sliding window, top-k routed MoE with clamped
SwiGLU experts; MXFP4 expert weights are de-quantized at load."""

from __future__ import annotations

import torch

from pace_core.models.builder import ModelBuilder
from pace_core.models.decoder import DecoderLM
from pace_core.models.families import llama
from pace_core.models.moe import MoE, Routing, bind_experts
from pace_core.models.mxfp4 import dequantize_mxfp4


def _expert_tensor(b: ModelBuilder, name: str) -> torch.Tensor:
    """A dense expert tensor, de-quantizing ``{name}_blocks``/``_scales`` when stored as MXFP4."""
    if b.weights.has(f"{name}_blocks"):
        blocks = b.weights.take(f"{name}_blocks")
        scales = b.weights.take(f"{name}_scales")
        return dequantize_mxfp4(blocks, scales, b.dtype)
    return b.tensor(name)


def moe_mlp(b: ModelBuilder, prefix: str) -> MoE:
    """Router + experts under ``{prefix}`` (``mlp.router``, ``mlp.experts``)."""
    cfg = b.config
    experts = bind_experts(
        b,
        _expert_tensor(b, f"{prefix}.experts.gate_up_proj"),
        _expert_tensor(b, f"{prefix}.experts.down_proj"),
        module=f"{prefix}.experts",
        top_k=cfg.num_experts_per_tok,
        activation="swiglu_oai",
        biases=(
            b.tensor(f"{prefix}.experts.gate_up_proj_bias"),
            b.tensor(f"{prefix}.experts.down_proj_bias"),
        ),
        alpha=getattr(cfg, "swiglu_alpha", 1.702),
        limit=cfg.swiglu_limit,
    )
    router = b.linear(f"{prefix}.router", bias=True, keep_format=True)
    routing = Routing("topk_softmax", cfg.num_experts_per_tok)
    return MoE(router, experts, routing, num_experts=cfg.num_local_experts)


def sinks(b: ModelBuilder, layer: int, prefix: str) -> dict[str, torch.Tensor]:
    """The per-head attention sink logits (kept in fp32)."""
    return {"sinks": b.tensor(f"{prefix}.sinks", torch.float32)}


def build(b: ModelBuilder) -> DecoderLM:
    return llama.build(b, mlp=moe_mlp, attention_extra=sinks)
