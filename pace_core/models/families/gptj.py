"""GPT-J: parallel block (one ``ln_1`` feeds attention and MLP), bias-free q/k/v/out_proj,
interleaved (GPT-J layout) rotary on the first ``rotary_dim`` dims, ``gelu_new`` MLP
``fc_in/fc_out`` with bias, LayerNorm ``ln_f``, untied lm_head with bias.

HF builds its sin/cos from ``1 / 10000 ** (arange(0, rotary_dim, 2) / rotary_dim)`` in fp32,
exactly :class:`Rotary`'s default frequencies with ``rotary_dim``.
"""

from __future__ import annotations

from pace_core.models import common
from pace_core.models.builder import ModelBuilder
from pace_core.models.decoder import DecoderLM
from pace_core.models.layers import ParallelBlock
from pace_core.models.rope import Rotary


def build(b: ModelBuilder) -> DecoderLM:
    cfg = b.config
    _, _, hd = common.heads(cfg)
    eps = cfg.layer_norm_epsilon
    rotary = Rotary(cfg, hd, interleaved=True, rotary_dim=cfg.rotary_dim or hd)
    embed = common.embedding(b, "transformer.wte.weight")
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"transformer.h.{i}"
        attn = common.self_attention(b, i, f"{p}.attn", rotary=rotary, o_proj="out_proj")
        mlp = common.dense_mlp(b, f"{p}.mlp.fc_in", f"{p}.mlp.fc_out", cfg.activation_function)
        layers.append(ParallelBlock(b.norm(f"{p}.ln_1", eps, rms=False, bias=True), attn, mlp))
    return common.assemble(
        b,
        cfg,
        embed=embed,
        layers=layers,
        final_norm=b.norm("transformer.ln_f", eps, rms=False, bias=True),
        head=b.linear("lm_head", bias=True, head=True),
        rotaries=[rotary],
    )


# Causal-mask buffers stored by older GPT-J checkpoints (e.g. EleutherAI/gpt-j-6b).
build.harmless_extras = (r"transformer\.h\.\d+\.attn\.(masked_)?bias",)
