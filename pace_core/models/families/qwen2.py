"""Qwen2 / Qwen2.5: the Llama layout with q/k/v bias (no o_proj bias) and per-layer sliding
windows from ``config.layer_types`` (transformers derives them from ``use_sliding_window`` and
``max_window_layers``: layers ``i >= max_window_layers`` slide)."""

from __future__ import annotations

from pace_core.models.builder import ModelBuilder
from pace_core.models.decoder import DecoderLM
from pace_core.models.families import llama


def build(b: ModelBuilder) -> DecoderLM:
    return llama.build(b, qkv_bias=True, o_bias=False)
