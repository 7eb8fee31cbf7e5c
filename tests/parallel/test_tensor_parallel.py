"""Tensor parallelism (``LLMModel(tensor_parallel=2)``): two ranks of one thread each on this
machine give the same greedy tokens as one process in fp32, and bf16 tokens within the
near-tie rule, for Llama, Qwen2, Gemma 3 and Qwen3-MoE on both block caches; beam search (its
forks copy blocks on write) and prefix-cache hits replay on the other rank; bad sizes and
families are ConfigErrors; a rank that dies fails the steps that follow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from support.parity import topk_rule_ok
from support.tiny import FACTORIES

from pace_core.engine.llm import LLMModel
from pace_core.errors import ConfigError
from pace_core.parallel.comm import RankFailure
from pace_core.parallel.config import TensorParallelConfig
from pace_core.sampling.config import SamplingConfig

FAMILIES = ("llama", "qwen2-sliding", "gemma3", "qwen3-moe")
CACHES = ("paged", "slab_pool")
PROMPTS = [[1, 5, 7, 9, 11], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]]
GREEDY = SamplingConfig(max_new_tokens=10, do_sample=False)
TP2 = TensorParallelConfig(2, bind=False)  # the test process keeps its own affinity


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request, tmp_path_factory):
    return FACTORIES[request.param](tmp_path_factory.mktemp(request.param))


def _load(path, dtype, cache, tp=None) -> LLMModel:
    return LLMModel(str(path), dtype=dtype, kv_cache_type=cache, load_tokenizer=False,
                    quiet=True, tensor_parallel=tp)  # fmt: skip


def _tokens(llm: LLMModel, config: SamplingConfig = GREEDY) -> list[list[int]]:
    out = llm.generate([torch.tensor(p) for p in PROMPTS], config)
    return [s.token_ids for s in out.sequences]


@pytest.mark.parametrize("cache", CACHES)
def test_tp2_matches_one_process(family_dir, cache):
    """fp32: TP=2 greedy tokens equal TP=1's; bf16: every TP=2 token passes the near-tie rule
    against the fp32 reference's logits over the same prefix."""
    ref = _load(family_dir, torch.float32, cache)
    expected = _tokens(ref)
    tp = _load(family_dir, torch.float32, cache, TP2)
    try:
        assert "tensor parallel" in str(tp.op_plan)
        assert _tokens(tp) == expected
    finally:
        tp.close()
    tp16 = _load(family_dir, torch.bfloat16, cache, TP2)
    try:
        got = _tokens(tp16)
    finally:
        tp16.close()
    for prompt, tokens in zip(PROMPTS, got):
        logits = ref.logits([torch.tensor(prompt + tokens)])[0]
        for i, token in enumerate(tokens):
            assert topk_rule_ok(logits[len(prompt) - 1 + i], token), (prompt, tokens, i)


def test_forks_prefix_hits_and_embeddings_replay(tmp_path, monkeypatch):
    """Beam search forks sequences (copy-on-write block copies) and a repeated prompt adopts
    cached blocks: both replay exactly on rank 1 (8-token blocks: the prompts fill some);
    embeddings (states, then the head apart) and prompt logprobs (every position's logits)
    too."""
    monkeypatch.setenv("PACE_PAGED_BLOCK_TOKENS", "8")
    path = FACTORIES["llama"](tmp_path / "llama")
    beams = SamplingConfig(max_new_tokens=6, num_beams=3, do_sample=False)
    ref = _load(path, torch.float32, "paged")
    want_beams = [h.token_ids for h in ref.beam_search([torch.tensor(PROMPTS[1])], beams)[0]]
    want = _tokens(ref)
    tp = _load(path, torch.float32, "paged", TensorParallelConfig(2, bind=False))
    try:
        got = [h.token_ids for h in tp.beam_search([torch.tensor(PROMPTS[1])], beams)[0]]
        assert got == want_beams
        assert _tokens(tp) == want
        assert _tokens(tp) == want  # the second run adopts the first one's blocks
        assert tp._prefix_cache.prefix_hits > 0
        prompts = [torch.tensor(p) for p in PROMPTS]
        assert torch.allclose(tp.embed(prompts), ref.embed(prompts), atol=1e-5)
        scored = SamplingConfig(max_new_tokens=2, do_sample=False, prompt_logprobs=1)
        got_lp = tp.generate(prompts, scored).sequences[1].prompt_logprobs[1:]
        want_lp = ref.generate(prompts, scored).sequences[1].prompt_logprobs[1:]
        assert [t.token_id for t in got_lp] == [t.token_id for t in want_lp]
        assert all(abs(a.logprob - b.logprob) < 1e-4 for a, b in zip(got_lp, want_lp))
    finally:
        tp.close()


def test_quantized_on_load(tmp_path):
    """Each rank quantizes its own slices (int4, groups of 32: every shard holds whole groups,
    so the groups are one process's): the tokens equal one process's (all-reduces over gloo
    here, shared memory elsewhere)."""
    path = FACTORIES["llama"](tmp_path / "llama")
    quant = {"bits": 4, "group_size": 32}
    ref = LLMModel(str(path), dtype=torch.float32, load_tokenizer=False, quiet=True,
                   quantization=quant)  # fmt: skip
    gloo = TensorParallelConfig(2, bind=False, all_reduce="gloo")
    tp = LLMModel(str(path), dtype=torch.float32, load_tokenizer=False, quiet=True,
                  quantization=quant, tensor_parallel=gloo)  # fmt: skip
    try:
        assert _tokens(tp) == _tokens(ref)
    finally:
        tp.close()


def test_sizes_that_do_not_divide(tmp_path):
    path = FACTORIES["llama"](tmp_path / "llama")  # 4 heads, 2 KV heads, intermediate 128
    with pytest.raises(ConfigError) as err:
        _load(path, torch.float32, "paged", TensorParallelConfig(4, bind=False))
    message = str(err.value)
    assert "num_key_value_heads (2)" in message and "valid tensor_parallel sizes" in message
    assert "1, 2" in message


def test_int8_kv_cache(tmp_path):
    """The other ranks' caches store int8 KV rows too (the cache options travel with them)."""
    path = FACTORIES["llama"](tmp_path / "llama")
    kw = {"dtype": torch.float32, "load_tokenizer": False, "quiet": True, "kv_cache_dtype": "int8"}
    want = _tokens(LLMModel(str(path), **kw))
    tp = LLMModel(str(path), **kw, tensor_parallel=TP2)
    try:
        assert _tokens(tp) == want
    finally:
        tp.close()


def test_bad_config():
    with pytest.raises(ConfigError, match="all_reduce 'mpi': use one of shm, gloo"):
        TensorParallelConfig(2, all_reduce="mpi")
    with pytest.raises(ConfigError, match="integer >= 1"):
        TensorParallelConfig.coerce(0)


def test_unsupported_family_and_cache(tmp_path):
    path = FACTORIES["gpt-oss"](tmp_path / "gpt-oss")
    with pytest.raises(ConfigError, match="'gpt_oss' cannot be split"):
        _load(path, torch.float32, "paged", TP2)
    with pytest.raises(ConfigError, match="needs a block cache"):
        _load(path, torch.float32, "dynamic", TP2)


def test_a_rank_that_cannot_start(tmp_path, monkeypatch):
    from pace_core.parallel import group

    def broken(self, args):
        return subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"],
                                stdin=subprocess.PIPE)  # fmt: skip

    monkeypatch.setattr(group.RankGroup, "_spawn", broken)
    path = FACTORIES["llama"](tmp_path / "llama")
    with pytest.raises(RankFailure, match=r"rank 1 exited while starting \(exit code 3\)"):
        _load(path, torch.float32, "paged", TP2)


def test_a_dead_rank_fails_the_next_step(tmp_path):
    path = FACTORIES["llama"](tmp_path / "llama")
    tp = _load(path, torch.float32, "paged", TP2)
    try:
        _tokens(tp)
        (pid,) = tp.model.group.pids
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while tp.model.comm.failure is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(RankFailure, match=r"rank 1 \(pid \d+\) exited \(killed by SIGKILL\)"):
            _tokens(tp)
    finally:
        tp.close()
