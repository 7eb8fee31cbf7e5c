"""A W8A8 copy of a checkpoint in the compressed-tensors format, for vLLM-CPU.

vLLM's int8 path (``CompressedTensorsW8A8Int8``) reads int8 weights with one scale per output
channel and quantizes activations per token at run time. The copy holds the codes and scales
pace's own ``quantization="w8a8"`` makes (``pace_core.quant.quantize``), so both engines
multiply the same int8 weights; the embeddings and LM head stay in the checkpoint's dtype
(vLLM keeps ``lm_head`` out of the scheme), the activations follow each engine's scheme
(vLLM per token, pace per group of 64).

    path = w8a8_copy(model_path("smollm2"))   # cached under $PACE_CACHE_DIR/compressed-tensors
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pace_core import zoo
from pace_core.quant import PRESETS, quantize

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
                        "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "int", "symmetric": True,
                                  "strategy": "token", "dynamic": True},
        }
    },
    "ignore": ["lm_head"],
}  # fmt: skip


def is_linear(name: str) -> bool:
    """Whether tensor ``name`` is the weight of a decoder layer's linear (quantized)."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in LINEARS


def w8a8_copy(model_dir: Path) -> Path:
    """The compressed-tensors W8A8 copy of the (single-file safetensors) checkpoint in
    ``model_dir``, written once next to the other pace caches."""
    out = zoo.cache_root() / "compressed-tensors" / f"{model_dir.name}-w8a8"
    if (out / "model.safetensors").exists():
        return out
    files = sorted(model_dir.glob("*.safetensors"))
    if len(files) != 1:
        raise ValueError(f"{model_dir}: expected one model.safetensors, found {len(files)}")
    tmp = out.with_suffix(".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(model_dir, tmp, ignore=shutil.ignore_patterns("*.safetensors", "*.gguf"))
    tensors: dict[str, torch.Tensor] = {}
    with safe_open(str(files[0]), "pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            t = f.get_tensor(name)
            if not is_linear(name):
                tensors[name] = t
                continue
            q = quantize(t, PRESETS["w8a8"], name=name)
            tensors[name] = q.data.contiguous()
            tensors[name + "_scale"] = q.scales.float().reshape(-1, 1).contiguous()
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((tmp / "config.json").read_text())
    config["quantization_config"] = QUANTIZATION_CONFIG
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
