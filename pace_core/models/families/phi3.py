"""Phi-3 / Phi-4 (mini): the Llama layout with a fused ``qkv_proj`` and a fused
``gate_up_proj`` (gate first), partial rotary and longrope (both read by :class:`Rotary` from
``rope_parameters``), and ``config.sliding_window`` on every layer when set."""

from __future__ import annotations

from pace_core.models import common
from pace_core.models.builder import ModelBuilder
from pace_core.models.decoder import DecoderLM
from pace_core.models.families import llama
from pace_core.models.layers import Bound


def fused_qkv(b: ModelBuilder, prefix: str, bias: bool) -> Bound:
    n, kv, hd = common.heads(b.config)
    return b.qkv(fused=f"{prefix}.qkv_proj", sizes=(n * hd, kv * hd, kv * hd), bias=bias)


def fused_gated_mlp(b: ModelBuilder, prefix: str) -> Bound:
    fused = b.matrix(b.tensor(f"{prefix}.gate_up_proj.weight"), f"{prefix}.gate_up_proj")
    gate, up = fused.split([fused.shape[0] // 2] * 2)
    down = b.tensor(f"{prefix}.down_proj.weight")
    return b.gated_mlp(gate, up, down, common.activation(b.config.hidden_act), module=prefix)


def build(b: ModelBuilder) -> DecoderLM:
    return llama.build(
        b,
        qkv_bias=False,
        o_bias=False,
        qkv=fused_qkv,
        mlp=fused_gated_mlp,
        window=common.every_layer_window,
    )
