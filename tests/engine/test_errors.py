"""Bad input gets a clear error that names the bad value and the fix."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from pace_core import LLMModel, SamplingConfig
from pace_core.errors import ConfigError, ModelLoadError


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False)


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_unsupported_dtype(tiny_llama_dir):
    with pytest.raises(ConfigError, match="float16"):
        LLMModel(tiny_llama_dir, dtype=torch.float16, load_tokenizer=False)


def test_unknown_cache_type(tiny_llama_dir):
    with pytest.raises(ConfigError, match="kv_cache_type 'pagd'.*dynamic"):
        LLMModel(tiny_llama_dir, kv_cache_type="pagd", load_tokenizer=False)


def test_bad_opconfig(tiny_llama_dir):
    with pytest.raises(ConfigError, match="unknown op 'linaer'.*did you mean 'linear'"):
        LLMModel(tiny_llama_dir, opconfig={"linaer": "native"}, load_tokenizer=False)
    with pytest.raises(ConfigError, match="unknown backend 'fastest'"):
        LLMModel(tiny_llama_dir, opconfig="linear=fastest", load_tokenizer=False)


def test_missing_model_dir_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="not a local directory.*HF_HUB_OFFLINE"):
        LLMModel("no-such-org/no-such-model", load_tokenizer=False)


def test_dir_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        LLMModel(tmp_path, load_tokenizer=False)


def test_truncated_weights(tiny_llama_dir, tmp_path):
    path = copy_model(tiny_llama_dir, tmp_path / "m")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="model.safetensors.*truncated or corrupt"):
        LLMModel(path, load_tokenizer=False)


def test_missing_and_unexpected_tensors(tiny_llama_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    path = copy_model(tiny_llama_dir, tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.extra.weight"] = torch.zeros(2)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(
        ModelLoadError, match=r"missing tensors: model\.layers\.1\.mlp\.up_proj\.weight"
    ):
        LLMModel(path, load_tokenizer=False)
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(128, 64)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(
        ModelLoadError, match=r"unexpected tensors: model\.extra\.weight.*strict=False"
    ):
        LLMModel(path, load_tokenizer=False)
    LLMModel(path, load_tokenizer=False, strict=False)  # tolerated when asked


def test_unsupported_model_type(tiny_llama_dir, tmp_path):
    path = copy_model(tiny_llama_dir, tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["model_type"] = "bert"  # transformers knows it (BertLMHeadModel): not these weights
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="'bert' checkpoint.*missing tensors"):
        LLMModel(path, load_tokenizer=False)
    cfg["model_type"] = "no_such_arch"  # neither pace nor transformers knows it
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="no_such_arch"):
        LLMModel(path, load_tokenizer=False)


def test_bad_prompts(tiny):
    with pytest.raises(ConfigError, match="empty"):
        tiny.generate([[1, 2], []])
    with pytest.raises(ConfigError, match="token id 500 outside the vocabulary"):
        tiny.generate(torch.tensor([[1, 500]]))
    with pytest.raises(ConfigError, match="context window is 64"):
        tiny.generate(torch.ones(1, 64, dtype=torch.long))
    with pytest.raises(ConfigError, match="need a tokenizer"):
        tiny.generate("hello")
    with pytest.raises(ConfigError, match="unsupported generate"):
        tiny.generate(3.5)
    with pytest.raises(ConfigError, match="2 sampling configs for 1 prompts"):
        tiny.generate(torch.tensor([[1, 2]]), [SamplingConfig(), SamplingConfig()])


def test_bad_sampling_config():
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-1)
    with pytest.raises(ValueError, match="max_new_tokenz.*max_new_tokens"):
        SamplingConfig.from_dict({"max_new_tokenz": 3})


def test_spec_config_rejected_clearly(tiny_llama_dir):
    with pytest.raises(ConfigError, match="speculative"):
        LLMModel(tiny_llama_dir, spec_config={"k": 3}, load_tokenizer=False)
