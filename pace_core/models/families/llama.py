"""Llama 1–3.3 (and SmolLM, Mistral-style configs): pre-norm, GQA, gated SiLU MLP."""

from __future__ import annotations

from pace_core.models import common
from pace_core.models.decoder import DecoderLM, ModelBuilder
from pace_core.models.layers import PreNormBlock

ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


def build(b: ModelBuilder, *, qkv_bias: bool | None = None) -> DecoderLM:
    cfg = b.config
    n, kv, hd = common.heads(cfg)
    eps = cfg.rms_norm_eps
    bias = getattr(cfg, "attention_bias", False) if qkv_bias is None else qkv_bias
    o_bias = getattr(cfg, "attention_bias", False)
    rotaries = common.rotaries_by_type(cfg, hd)
    rotary = rotaries[None]
    embed, embed_weight = common.embedding(b, "model.embed_tokens.weight")
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        attn = b.attention(
            layer=i,
            qkv=b.qkv([f"{p}.self_attn.{x}_proj" for x in "qkv"], bias=bias),
            o_proj=b.linear(f"{p}.self_attn.o_proj", bias=o_bias),
            rotary=rotary, num_heads=n, num_kv_heads=kv, head_dim=hd, scale=hd**-0.5,
            window=common.layer_window(cfg, i),
        )  # fmt: skip
        mlp = common.gated_mlp(b, f"{p}.mlp", ACTIVATIONS[cfg.hidden_act])
        layers.append(PreNormBlock(
            b.norm(f"{p}.input_layernorm", eps), attn, b.norm(f"{p}.post_attention_layernorm", eps), mlp
        ))  # fmt: skip
    return common.assemble(
        b, cfg, embed=embed, layers=layers, final_norm=b.norm("model.norm", eps),
        head=common.lm_head(b, cfg, embed_weight), rotaries=[rotary],
    )  # fmt: skip
