"""SmolLM3: the Llama layout where every ``no_rope_layer_interval``-th layer has no rotary
embedding (NoPE; ``config.no_rope_layers[i]`` is 1 where layer i uses rope), sliding windows
from ``config.layer_types``."""

from __future__ import annotations

from typing import Any

from pace_core.models.builder import ModelBuilder
from pace_core.models.decoder import DecoderLM
from pace_core.models.families import llama


def uses_rope(cfg: Any, layer: int) -> bool:
    return bool(cfg.no_rope_layers[layer])


def build(b: ModelBuilder) -> DecoderLM:
    return llama.build(b, uses_rope=uses_rope)
