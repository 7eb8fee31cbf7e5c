"""Prefix caching in LLMModel.generate: a batch sharing a long instruction computes it once,
later calls reuse it, and the greedy tokens equal generation without caching."""

from __future__ import annotations

import pytest
import torch
from support.parity import topk_rule_ok

from pace_core.engine.llm import LLMModel
from pace_core.errors import ConfigError
from pace_core.sampling import SamplingConfig

SYSTEM = (
    "You are a careful assistant who answers questions about the history of European "
    "rivers, the bridges across them and the towns built along their banks. "
) * 12
QUESTIONS = ["Name a river.", "What is a bridge?", "Where is the Rhine?", "Why do towns grow?"]
CHATS = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in QUESTIONS]
CFG = SamplingConfig(max_new_tokens=12)


def _load(path, kv, caching, dtype=torch.float32):
    return LLMModel(path, dtype=dtype, kv_cache_type=kv, prefix_caching=caching, quiet=True)


@pytest.mark.parametrize(
    "kv, dtype",
    [("paged", torch.float32), ("slab_pool", torch.float32), ("paged", torch.bfloat16)],
)
def test_shared_instruction_is_computed_once_and_reused(smollm2_dir, kv, dtype, monkeypatch):
    """fp32: the same greedy tokens as without caching. bf16 (the fused decoder stacks read
    adopted blocks through the block table): rows computed in a smaller forward may round
    differently, so every token must be a near-tie choice of the uncached model."""
    monkeypatch.setenv("PACE_SLAB_BLOCK_TOKENS", "64")
    plain = _load(smollm2_dir, kv, False, dtype)
    expected = plain.generate(CHATS, CFG).generated_token_ids
    llm = _load(smollm2_dir, kv, None, dtype)  # on by default for block caches
    assert llm.prefix_caching
    first = llm.generate(CHATS, CFG)
    cache = llm.generation_cache()
    hits_first = cache.prefix_hits
    again = llm.generate(CHATS[::-1], CFG)
    if dtype == torch.float32:
        assert first.generated_token_ids == expected
        assert again.generated_token_ids == expected[::-1]
    else:
        for out in (first, again):
            for seq in out.sequences:
                ids = torch.tensor([seq.prompt_token_ids + seq.token_ids])
                ref = plain.logits(ids)[0]
                start = len(seq.prompt_token_ids) - 1
                for t, token in enumerate(seq.token_ids):
                    assert topk_rule_ok(ref[start + t], token), (t, token)
    prompt = len(first.sequences[0].prompt_token_ids)
    assert hits_first >= 3 * (prompt // 64 - 1) * 64  # 3 of 4 prompts adopt the instruction
    assert cache.prefix_hits - hits_first >= 4 * (prompt // 64 - 1) * 64  # all 4 the 2nd time
    assert not cache.lens
    cache.pool.check()


def test_an_abandoned_stream_frees_its_sequences_and_a_busy_cache_is_not_shared(smollm2_dir):
    llm = _load(smollm2_dir, "paged", True)
    stream = llm.stream(CHATS[0], SamplingConfig(max_new_tokens=8))
    next(iter(stream))
    persistent = llm._prefix_cache
    assert persistent is not None and persistent.lens  # the stream holds it
    other = llm.generation_cache()
    assert other is not persistent and not other.prefix_caching
    stream.close()
    assert not persistent.lens and llm.generation_cache() is persistent


def test_prefix_caching_needs_a_block_cache(smollm2_dir):
    with pytest.raises(ConfigError, match="block cache"):
        _load(smollm2_dir, "dynamic", True)
    assert not _load(smollm2_dir, "dynamic", None).prefix_caching
