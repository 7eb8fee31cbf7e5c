"""Checkpoint formats: single/sharded safetensors, single/sharded .bin, tied embeddings."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from support.bin_checkpoints import write_bin_shards

from pace_core import LLMModel


def reference_logits(path, ids):
    return LLMModel(path, dtype=torch.float32, load_tokenizer=False).logits(ids)


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
    # torch's legacy (pre-zip) format cannot be memory-mapped: it is read whole
    torch.save(state, single_bin / "pytorch_model.bin", _use_new_zipfile_serialization=False)
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


def test_conversion_while_reading_equals_reading_then_converting(tmp_path, monkeypatch):
    """A tensor converted to another float type is read a few rows at a time (here 1 KB):
    the result is the stored tensor converted, whatever the chunking; a short file is named."""
    from safetensors.torch import save_file

    from pace_core.errors import ModelLoadError
    from pace_core.models import weights

    table = torch.randn(37, 19)  # 76-byte fp32 rows: 13 rows per 1 KB chunk, a ragged last one
    save_file({"t": table, "v": torch.randn(5)}, str(tmp_path / "model.safetensors"))
    monkeypatch.setattr(weights, "CONVERT_CHUNK_BYTES", 1024)
    store = weights.WeightStore.from_dir(tmp_path)
    assert torch.equal(store.take("t", torch.bfloat16), table.to(torch.bfloat16))
    assert store.take("v", torch.bfloat16).dtype == torch.bfloat16
    path = tmp_path / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-200])  # cuts into the tensors' data
    with pytest.raises(ModelLoadError, match=r"truncated or corrupt .*re-download"):
        weights.WeightStore.from_dir(tmp_path).take("t", torch.bfloat16)


def test_the_heap_is_trimmed_every_so_many_bytes_taken(monkeypatch):
    from pace_core.models import heap

    calls = []
    monkeypatch.setattr(heap, "trim", lambda: calls.append(1))
    every = heap.TrimEvery(100)
    for _ in range(9):
        every.add(30)  # trims at 120 and 240 (each time the count restarts from 0)
    assert len(calls) == 2


_KEEP_SCRIPT = """
import sys, torch
from pace_core.models import heap

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

if sys.argv[1] == "keep":
    assert heap.keep_step_transients()
torch.empty(40 << 20, dtype=torch.uint8).fill_(1)  # a step's 40 MB transient, freed
print(rss_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc policy")
def test_a_serving_process_keeps_step_transients_between_steps():
    """Above glibc's mmap threshold a freed block goes back to the OS and the next step faults
    its pages in again; after keep_step_transients it stays in the heap for the next step."""

    def kept_mb(mode: str) -> float:
        out = subprocess.run(
            [sys.executable, "-c", _KEEP_SCRIPT, mode], capture_output=True, text=True, check=True
        )
        return float(out.stdout.split()[-1])

    default, kept = kept_mb("default"), kept_mb("keep")
    assert kept - default > 30  # the 40 MB transient stayed resident after it was freed


_FROZEN_SCRIPT = """
import gc
from pace_core.models import heap

assert gc.get_freeze_count() == 0
with heap.loaded_objects_frozen():  # one engine loop ...
    outer = gc.get_freeze_count()
    with heap.loaded_objects_frozen():  # ... and a second one, ending first
        pass
    still = gc.get_freeze_count()
print(outer, still, gc.get_freeze_count())
"""


def test_engine_loops_freeze_the_loaded_objects_until_the_last_one_ends():
    """In a fresh process (nothing else frozen): a loop freezes what is alive, a second loop
    ending does not thaw the first one's, and the last one to end hands them all back."""
    out = subprocess.run(
        [sys.executable, "-c", _FROZEN_SCRIPT], capture_output=True, text=True, check=True
    )
    outer, still, after = map(int, out.stdout.split())
    assert outer > 1000 and still >= outer and after == 0


def test_a_weight_under_two_names_is_an_error_not_a_coin_toss():
    """A multimodal wrapper's rename that lands on a name the checkpoint already has would keep
    whichever came last (the file's order): an error naming the tensor instead."""
    from pace_core.errors import ModelLoadError
    from pace_core.models.weights import WeightStore

    w = torch.zeros(2, 2)
    store = WeightStore.from_tensors(
        {"language_model.model.norm.weight": w, "model.norm.weight": w}, source="ckpt"
    )
    with pytest.raises(ModelLoadError, match="ckpt: two tensors are 'model.norm.weight'"):
        store.rename_prefix("language_model.model.", "model.")
