"""GPT-J: parallel block (one ``ln_1`` feeds attention and MLP), bias-free q/k/v/out_proj,
interleaved (GPT-J layout) rotary on the first ``rotary_dim`` dims, ``gelu_new`` MLP
``fc_in/fc_out`` with bias, LayerNorm ``ln_f``, untied lm_head with bias.

HF builds its sin/cos from ``1 / 10000 ** (arange(0, rotary_dim, 2) / rotary_dim)`` in fp32,
exactly :class:`Rotary`'s default frequencies with ``rotary_dim``.
"""

from __future__ import annotations

from pace_core.models import common
from pace_core.models.decoder import DecoderLM, ModelBuilder
from pace_core.models.layers import ParallelBlock
from pace_core.models.rope import Rotary


def build(b: ModelBuilder) -> DecoderLM:
    cfg = b.config
    n, _, hd = common.heads(cfg)
    eps = cfg.layer_norm_epsilon
    rotary = Rotary(cfg, hd, interleaved=True, rotary_dim=cfg.rotary_dim or hd)
    embed, _ = common.embedding(b, "transformer.wte.weight")
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"transformer.h.{i}"
        attn = b.attention(
            layer=i,
            qkv=b.qkv([f"{p}.attn.{x}_proj" for x in "qkv"]),
            o_proj=b.linear(f"{p}.attn.out_proj"),
            rotary=rotary,
            num_heads=n,
            num_kv_heads=n,
            head_dim=hd,
            scale=hd**-0.5,
        )
        mlp = common.dense_mlp(b, f"{p}.mlp.fc_in", f"{p}.mlp.fc_out", cfg.activation_function)
        layers.append(ParallelBlock(b.norm(f"{p}.ln_1", eps, rms=False, bias=True), attn, mlp))
    return common.assemble(
        b,
        cfg,
        embed=embed,
        layers=layers,
        final_norm=b.norm("transformer.ln_f", eps, rms=False, bias=True),
        head=b.linear("lm_head", bias=True),
        rotaries=[rotary],
    )


# Causal-mask buffers stored by older GPT-J checkpoints (e.g. EleutherAI/gpt-j-6b).
build.harmless_extras = (r"transformer\.h\.\d+\.attn\.(masked_)?bias",)
