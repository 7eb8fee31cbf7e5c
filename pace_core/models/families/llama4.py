"""Llama 4 (text): the Llama layout with

* rope layers (``config.no_rope_layers[i]`` = 1) in chunked local attention
  (``attention_chunk_size``), interleaved (complex-pair) rope, then a weightless RMS
  ("L2") norm over each query and key head when ``use_qk_norm``;
* NoPE layers with full causal attention and, with ``attn_temperature_tuning``, queries scaled
  by ``1 + attn_scale * log1p(floor((pos + 1) / floor_scale))``;
* MoE layers (``config.moe_layers``): sigmoid of the top-k router logits weighs each expert's
  *input*, plus a shared expert on every token; the other layers are dense gated MLPs
  (``intermediate_size_mlp``).

``build_conditional`` loads the text part of a ``Llama4ForConditionalGeneration`` checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch

from pace_core.caches.base import ChunkedWindow, Window
from pace_core.models import common
from pace_core.models.builder import ModelBuilder
from pace_core.models.decoder import DecoderLM
from pace_core.models.families import llama
from pace_core.models.layers import Bound
from pace_core.models.moe import MoE, Routing, bind_experts, layer_of
from pace_core.stack_spec import TemperatureTuning


def uses_rope(cfg: Any, layer: int) -> bool:
    return bool(cfg.no_rope_layers[layer])


def window(cfg: Any, layer: int) -> Window:
    chunk = getattr(cfg, "attention_chunk_size", None)
    if cfg.layer_types[layer] == "chunked_attention" and chunk:
        return ChunkedWindow(int(chunk))
    return None


def attention_extra(b: ModelBuilder, layer: int, prefix: str) -> dict[str, Any]:
    cfg = b.config
    if uses_rope(cfg, layer):
        if not cfg.use_qk_norm:
            return {}
        _, _, hd = common.heads(cfg)
        norm = b.unit_norm(hd, cfg.rms_norm_eps)
        return {"q_norm": norm, "k_norm": norm, "norms_after_rope": True}
    if cfg.attn_temperature_tuning:
        return {"temperature": TemperatureTuning(cfg.attn_scale, cfg.floor_scale)}
    return {}


def _experts(b: ModelBuilder, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate_up [E, H, 2I] interleaved, down [E, I, H]) from Llama 4's [E, H, 2I] halves."""
    gate, up = b.tensor(f"{prefix}.gate_up_proj").chunk(2, dim=-1)
    return torch.stack((gate, up), dim=-1).flatten(-2), b.tensor(f"{prefix}.down_proj")


def mlp(b: ModelBuilder, prefix: str) -> MoE | Bound:
    cfg = b.config
    if layer_of(prefix) not in cfg.moe_layers:
        return llama.separate_gated_mlp(b, prefix)
    if cfg.hidden_act not in ("silu", "swish"):
        raise ValueError(f"Llama 4 experts with hidden_act {cfg.hidden_act!r} are not supported")
    gate_up, down = _experts(b, f"{prefix}.experts")
    experts = bind_experts(
        b, gate_up, down, module=f"{prefix}.experts", top_k=cfg.num_experts_per_tok
    )
    return MoE(
        b.linear(f"{prefix}.router", bias=False, keep_format=True),
        experts,
        Routing("topk_sigmoid", cfg.num_experts_per_tok),
        num_experts=cfg.num_local_experts,
        shared=llama.separate_gated_mlp(b, f"{prefix}.shared_expert"),
        scale_input=True,
    )


def build(b: ModelBuilder) -> DecoderLM:
    return llama.build(
        b,
        mlp=mlp,
        mlp_name="feed_forward",
        window=window,
        uses_rope=uses_rope,
        attention_extra=attention_extra,
        interleaved_rope=True,
    )


def build_conditional(b: ModelBuilder) -> DecoderLM:
    return common.build_text_part(b, build)


build_conditional.harmless_extras = (r"vision_model\..*", r"multi_modal_projector\..*")
