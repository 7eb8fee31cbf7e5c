"""Mistral (7B v0.1-v0.3 layout): Llama with ``config.sliding_window`` (when set) on every
layer."""

from __future__ import annotations

from pace_core.models import common
from pace_core.models.builder import ModelBuilder
from pace_core.models.decoder import DecoderLM
from pace_core.models.families import llama


def build(b: ModelBuilder) -> DecoderLM:
    return llama.build(b, window=common.every_layer_window)
