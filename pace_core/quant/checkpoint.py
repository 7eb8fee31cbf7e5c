"""Quantized checkpoints pace writes and reads back without re-quantizing.

A saved model is an ordinary Hugging Face directory: ``config.json`` gains a
``quantization_config`` (``{"quant_method": "pace", ...}``), and ``model.safetensors`` holds each
quantized matrix as ``<name>`` (codes), ``<name>_scales`` and ``<name>_mins`` (when it has mins),
described in the file's metadata under :data:`METADATA_KEY` (format, shape, group size).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

from pace_core.errors import ConfigError
from pace_core.quant.weight import PACE_FORMATS, QuantizedWeight

METADATA_KEY = "pace_quantized"
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json",
                "*.gguf", "pace-zoo.json")  # fmt: skip


def pack(weights: Mapping[str, QuantizedWeight]) -> tuple[dict[str, torch.Tensor], str]:
    """The tensors storing ``weights`` and the JSON describing them."""
    tensors: dict[str, torch.Tensor] = {}
    described = {}
    for name, w in weights.items():
        if w.format not in PACE_FORMATS:
            raise ConfigError(f"{name} is {w.format}: only pace's own formats are saved this way")
        tensors[name] = w.data.contiguous()
        tensors[f"{name}_scales"] = w.scales.contiguous()
        if w.mins is not None:
            tensors[f"{name}_mins"] = w.mins.contiguous()
        described[name] = {"format": w.format, "shape": list(w.shape), "group_size": w.group_size}
        if w.activations:  # W8A8: the kernels quantize the activations too
            described[name]["activations"] = w.activations
    return tensors, json.dumps(described)


def unpack(metadata: Mapping[str, str] | None) -> dict[str, dict[str, Any]]:
    """The quantized tensors a safetensors file describes (``{}`` for an ordinary file)."""
    if not metadata or METADATA_KEY not in metadata:
        return {}
    return json.loads(metadata[METADATA_KEY])


def assemble(get: Any, name: str, info: Mapping[str, Any], names: set[str]) -> QuantizedWeight:
    """A :class:`QuantizedWeight` from its stored parts (``get(name) -> tensor``)."""
    mins = get(f"{name}_mins") if f"{name}_mins" in names else None
    return QuantizedWeight(info["format"], tuple(info["shape"]), torch.float32, get(name),
                           get(f"{name}_scales"), mins, int(info["group_size"]),
                           activations=info.get("activations", ""))  # fmt: skip
