"""Qwen3 (dense): the Llama layout with an RMSNorm over each query and key head before rope
(QK-norm), no qkv bias unless ``attention_bias``, per-layer sliding windows from
``config.layer_types`` as Qwen2."""

from __future__ import annotations

from typing import Any

from pace_core.models.builder import ModelBuilder
from pace_core.models.decoder import DecoderLM
from pace_core.models.families import llama


def qk_norms(b: ModelBuilder, layer: int, prefix: str) -> dict[str, Any]:
    """``{prefix}.q_norm`` / ``{prefix}.k_norm``: RMSNorms over the head dim."""
    eps = b.config.rms_norm_eps
    return {"q_norm": b.norm(f"{prefix}.q_norm", eps), "k_norm": b.norm(f"{prefix}.k_norm", eps)}


def build(b: ModelBuilder) -> DecoderLM:
    return llama.build(b, attention_extra=qk_norms)
