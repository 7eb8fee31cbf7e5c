"""Checkpoint formats: single/sharded safetensors, single/sharded .bin, tied embeddings."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from pace_core import LLMModel


def reference_logits(path, ids):
    return LLMModel(path, dtype=torch.float32, load_tokenizer=False).logits(ids)


def write_bin_shards(state: dict, path, shards: int) -> None:
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = {n: state[n] for n in names[i::shards]}
        torch.save(part, path / file)
        weight_map.update(dict.fromkeys(part, file))
    (path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_formats_give_identical_logits(tiny_llama_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[1, 5, 9, 17, 33]])
    want = reference_logits(tiny_llama_dir, ids)
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype=torch.float32)

    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").exists()
    assert torch.equal(reference_logits(sharded, ids), want)

    state = load_file(tiny_llama_dir / "model.safetensors")
    single_bin = tmp_path / "bin"
    single_bin.mkdir()
    (single_bin / "config.json").write_text((tiny_llama_dir / "config.json").read_text())
    torch.save(state, single_bin / "pytorch_model.bin")
    assert torch.equal(reference_logits(single_bin, ids), want)

    sharded_bin = tmp_path / "bin_sharded"
    sharded_bin.mkdir()
    (sharded_bin / "config.json").write_text((tiny_llama_dir / "config.json").read_text())
    write_bin_shards(state, sharded_bin, 3)
    assert torch.equal(reference_logits(sharded_bin, ids), want)


def test_missing_shard_is_named(tiny_llama_dir, tmp_path):
    import pytest
    from transformers import AutoModelForCausalLM

    from pace_core.errors import ModelLoadError

    hf = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype=torch.float32)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(ModelLoadError, match=shard.name):
        LLMModel(tmp_path, load_tokenizer=False)


def test_bf16_load_casts_weights(tiny_llama_dir):
    model = LLMModel(
        tiny_llama_dir, dtype="bfloat16", load_tokenizer=False, opconfig="default=native"
    )
    assert model.model.lm_head.weight.weight.dtype == torch.bfloat16
    out = model.generate(torch.tensor([[1, 5, 9]]))
    assert out.sequences[0].token_ids
