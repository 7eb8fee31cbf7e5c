"""DeepSeek-V3 checkpoints as released: their multi-token-prediction layer (past
``num_hidden_layers``) is ignored as transformers does; FP8 weights are refused up front."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.tiny import FACTORIES

from pace_core import LLMModel
from pace_core.errors import ModelLoadError


def test_prediction_layers_past_the_decoder_are_ignored(tmp_path):
    path = FACTORIES["deepseek-v3"](tmp_path / "base")
    ids = torch.randint(3, 100, (1, 12), generator=torch.Generator().manual_seed(0))
    want = LLMModel(path, dtype=torch.float32, load_tokenizer=False).logits(ids)
    tensors = load_file(str(path / "model.safetensors"))
    last = json.loads((path / "config.json").read_text())["num_hidden_layers"] - 1
    for name, t in list(tensors.items()):  # an MTP layer: a copy of the last one, renamed
        if name.startswith(f"model.layers.{last}."):
            tensors[name.replace(f"layers.{last}.", f"layers.{last + 1}.")] = t.clone()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    got = LLMModel(path, dtype=torch.float32, load_tokenizer=False).logits(ids)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_fp8_checkpoints_are_refused_naming_the_method(tmp_path):
    path = FACTORIES["deepseek-v3"](tmp_path / "fp8")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3"}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"quantized as 'fp8'.*convert first"):
        LLMModel(path, dtype=torch.float32, load_tokenizer=False)
