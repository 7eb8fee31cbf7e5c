"""The prefix cache's disk tier: blocks survive a restart of the model, are used only by the
same model, dtype and weights, and a bad file is ignored with a warning, never loaded."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from pace_core import LLMModel, SamplingConfig
from pace_core.caches.disk_tier import DiskBlockStore
from pace_core.errors import ConfigError

BLOCK = 8
PROMPT = list(range(5, 45))  # 40 tokens: 4 full blocks adoptable (the last token computed)
GREEDY = SamplingConfig(max_new_tokens=6, ignore_eos=True)
LIKE = [(torch.zeros(2, BLOCK, 4), torch.zeros(2, BLOCK, 4)) for _ in range(3)]


def layers(seed: int):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(2, BLOCK, 4, generator=g), torch.randn(2, BLOCK, 4, generator=g))
        for _ in range(3)
    ]


def store(root, cap=1 << 20, **identity):
    return DiskBlockStore(root, {"model": "m", **identity}, cap)


# -- the store ------------------------------------------------------------------------------------
def test_blocks_round_trip_and_reopen(tmp_path):
    s = store(tmp_path)
    assert s.save(b"k1", layers(1)) and not s.save(b"k1", layers(1))  # once per key
    s.flush()
    again = store(tmp_path)
    got = again.load(b"k1", LIKE)
    assert got is not None and all(torch.equal(a, b) for a, b in zip(got[0], layers(1)[0]))
    assert again.load(b"k2", LIKE) is None


def test_another_identity_is_another_directory(tmp_path):
    store(tmp_path).save(b"k1", layers(1))
    store(tmp_path).flush()
    other = store(tmp_path, dtype="bf16")
    assert b"k1" not in other and other.load(b"k1", LIKE) is None


def test_lru_files_go_first_under_the_cap(tmp_path):
    one = sum(k.nbytes + v.nbytes for k, v in layers(0))
    s = store(tmp_path, cap=int(2.5 * one))
    for i in range(3):
        s.save(bytes([i]), layers(i))
        s.flush()
        if i == 1:
            assert s.load(bytes([0]), LIKE) is not None  # 0 is now more recent than 1
    assert bytes([1]) not in s and bytes([0]) in s and bytes([2]) in s
    assert len(list(s.dir.glob("*.safetensors"))) == 2


def test_bad_files_are_ignored_with_a_warning_and_removed(tmp_path, caplog):
    s = store(tmp_path)
    for key in (b"torn", b"shape", b"extra"):
        s.save(key, layers(3))
    s.flush()
    (s.dir / f"{b'torn'.hex()}.safetensors").write_bytes(b"\x00garbage")
    shape = {f"{kv}.{i}": torch.zeros(2, BLOCK, 5) for i in range(3) for kv in "kv"}
    save_file(shape, str(s.dir / f"{b'shape'.hex()}.safetensors"))
    extra = load_file(str(s.dir / f"{b'extra'.hex()}.safetensors"))
    save_file({**extra, "k.3": torch.zeros(1)}, str(s.dir / f"{b'extra'.hex()}.safetensors"))
    with caplog.at_level(logging.WARNING, logger="pace.caches.disk"):
        assert [s.load(k, LIKE) for k in (b"torn", b"shape", b"extra")] == [None] * 3
    assert caplog.text.count("ignoring unusable block file") == 3
    assert "layer 0 keys: (2, 8, 5)" in caplog.text
    assert not list(s.dir.glob("*.safetensors")) and len(s) == 0


def test_a_foreign_manifest_empties_the_directory(tmp_path, caplog):
    s = store(tmp_path)
    s.save(b"k1", layers(1))
    s.flush()
    (s.dir / "manifest.json").write_text('{"identity": "someone else"}')
    with caplog.at_level(logging.WARNING, logger="pace.caches.disk"):
        again = store(tmp_path)
    assert "another model's manifest" in caplog.text and len(again) == 0


# -- through a model -----------------------------------------------------------------------------
@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setenv("PACE_PAGED_BLOCK_TOKENS", str(BLOCK))


def run(path, cache_dir, dtype=torch.float32):
    """A fresh model (a restart) generating ``PROMPT``: its tokens, logits and the prompt
    tokens its cache restored from disk."""
    llm = LLMModel(path, dtype=dtype, load_tokenizer=False, prefix_cache_dir=cache_dir)
    out = llm.generate([PROMPT], GREEDY, output_logits=True)
    cache = llm._prefix_cache
    cache.disk.store.flush()
    return out.sequences[0].token_ids, out.logits[0], cache.disk_hits


def test_a_restart_restores_the_prompt_and_answers_the_same(tiny_llama_dir, tmp_path, small_blocks):
    cold_tokens, cold_logits, cold_hits = run(tiny_llama_dir, tmp_path)
    tokens, logits, hits = run(tiny_llama_dir, tmp_path)
    assert (cold_hits, hits) == (0, 32)
    assert tokens == cold_tokens
    torch.testing.assert_close(logits, cold_logits, atol=1e-5, rtol=0)
    plain = LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False)
    assert plain.generate([PROMPT], GREEDY).sequences[0].token_ids == tokens


def test_other_dtype_or_weights_never_use_the_blocks(tiny_llama_dir, tmp_path, small_blocks):
    run(tiny_llama_dir, tmp_path / "kv")
    assert run(tiny_llama_dir, tmp_path / "kv", torch.bfloat16)[2] == 0
    changed = tmp_path / "changed"
    shutil.copytree(tiny_llama_dir, changed)
    weights = load_file(str(changed / "model.safetensors"))
    name = next(iter(weights))
    weights[name] = weights[name] + 1.0
    save_file(weights, str(changed / "model.safetensors"), metadata={"format": "pt"})
    assert run(changed, tmp_path / "kv")[2] == 0


def test_a_corrupt_block_is_computed_again(tiny_llama_dir, tmp_path, small_blocks, caplog):
    tokens = run(tiny_llama_dir, tmp_path)[0]
    files = sorted(tmp_path.glob("*/*.safetensors"))
    assert len(files) == 5  # every full prompt block (the 5th is indexed, not adopted)
    for f in files:
        f.write_bytes(b"not a block")
    with caplog.at_level(logging.WARNING, logger="pace.caches.disk"):
        again, _, hits = run(tiny_llama_dir, tmp_path)
    assert hits == 0 and again == tokens and "ignoring unusable block file" in caplog.text


def test_bad_settings_are_clear_errors(tiny_llama_dir, tmp_path):
    with pytest.raises(ConfigError, match="needs prefix caching on a block cache"):
        LLMModel(tiny_llama_dir, kv_cache_type="dynamic", load_tokenizer=False,
                 prefix_cache_dir=tmp_path)  # fmt: skip
    with pytest.raises(ConfigError, match="prefix_cache_disk_gb must be a number > 0 \\(got 0\\)"):
        LLMModel(tiny_llama_dir, load_tokenizer=False, prefix_cache_dir=tmp_path,
                 prefix_cache_disk_gb=0)  # fmt: skip
