"""Quantized checkpoints pace writes and reads back without re-quantizing.

A saved model is an ordinary Hugging Face directory: ``config.json`` gains a
``quantization_config`` (``{"quant_method": "pace", ...}``), and ``model.safetensors`` holds each
quantized matrix as ``<name>`` (codes), ``<name>_scales`` and ``<name>_mins`` (when it has mins),
described in the file's metadata under :data:`METADATA_KEY` (format, shape, group size).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from pace_core.errors import ConfigError
from pace_core.quant.weight import PACE_FORMATS, QuantizedWeight

METADATA_KEY = "pace_quantized"
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json",
                "pace-zoo.json")  # fmt: skip


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
                           get(f"{name}_scales"), mins, int(info["group_size"]))  # fmt: skip


def save_quantized(
    model: str | Path,
    out: str | Path,
    quantization: Any,
    dtype: torch.dtype | str = torch.bfloat16,
) -> Path:
    """Quantize the checkpoint ``model`` (a Hugging Face directory or zoo name) and write the
    copy to ``out``: what pace then loads without re-quantizing (and with ``dtype`` as the
    compute dtype the weights de-quantize to, unless the load asks otherwise)."""
    from safetensors.torch import save_file

    from pace_core.models.loader import build_model, load_config, parse_dtype, resolve_model_path
    from pace_core.models.weights import WeightStore
    from pace_core.opconfig import OperatorConfig
    from pace_core.plugins import get_host
    from pace_core.quant.config import coerce_quantization

    q = coerce_quantization(quantization)
    if q is None:
        raise ConfigError("save_quantized needs a quantization: 'int8', 'int4', ...")
    source, out = resolve_model_path(model), Path(out)
    if not source.is_dir():
        raise ConfigError(f"{source} is not a Hugging Face directory (a GGUF file?): not saved")
    config = json.loads((source / "config.json").read_text())
    if "quantization_config" in config:
        raise ConfigError(f"{source} is already a quantized checkpoint; start from the original")
    host = get_host()
    recorded: dict[str, Any] = {}
    hf_config = load_config(source)
    resolver = host.resolver(OperatorConfig.coerce("default=native"))  # no packed copies
    build_model(source, hf_config, parse_dtype(dtype), host, resolver, quiet=True,
                quantization=q, record=recorded)  # fmt: skip
    tensors, described = pack(recorded)
    recorded.clear()
    store = WeightStore.from_dir(source)
    tied = getattr(hf_config, "tie_word_embeddings", False)
    for name in store.names():
        if name in tensors or (tied and name == "lm_head.weight"):
            continue
        tensors[name] = store.take(name).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and not any(item.match(p) for p in WEIGHT_FILES):
            shutil.copy2(item, out / item.name)
    save_file(tensors, str(out / "model.safetensors"), metadata={METADATA_KEY: described})
    config["quantization_config"] = q.to_json()
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
