"""The Inferencer protocol and its LLMModel adapter; prompt lookup; stats."""

from __future__ import annotations

import pytest
import torch
from support.spec_models import prompts

from pace_core import LLMModel, SamplingConfig
from pace_core.sampling.sampler import BatchSampler
from pace_core.speculative import (
    Inferencer,
    ModelInferencer,
    PromptLookupConfig,
    PromptLookupProposer,
    Proposer,
    SequenceKV,
    SpecStats,
)
from pace_core.speculative.ngram import lookup


@pytest.fixture(scope="module")
def plain(target_dir):
    return LLMModel(target_dir, dtype=torch.float32, load_tokenizer=False)


@pytest.mark.parametrize("cache", ["dynamic", "paged"])
def test_model_inferencer_reproduces_generate(cache, target_dir, plain):
    llm = LLMModel(target_dir, dtype=torch.float32, load_tokenizer=False, kv_cache_type=cache)
    inf = llm.inferencer
    assert isinstance(inf, ModelInferencer) and isinstance(inf, Inferencer)
    batch = prompts()[:3]
    cfg = SamplingConfig(max_new_tokens=10, ignore_eos=True)
    kv = inf.new_kv(len(batch))
    assert isinstance(kv, SequenceKV)
    first = inf.prefill(batch, kv, None)
    assert first.token_ids.shape == (3, 1) and first.token_logits.shape == (3, 9, 128)
    rest = inf.decode(first.token_ids, kv, 9, None)
    assert rest.token_ids.shape == (3, 9) and rest.token_logits.shape == (3, 9, 128)
    got = torch.cat([first.token_ids, rest.token_ids], dim=1).tolist()
    assert got == plain.generate(batch, cfg).generated_token_ids
    # the cache holds the queries: prompt + every generated token but the last
    assert kv.get_num_tokens() == [p.numel() + 9 for p in batch]
    # roll back 4 tokens and decode again: same continuation
    kv.crop(4)
    again = inf.decode(rest.token_ids[:, 4:5], kv, 5, None)
    assert again.token_ids[:, :4].tolist() == rest.token_ids[:, 5:].tolist()
    torch.testing.assert_close(
        again.token_logits[:, :4], rest.token_logits[:, 5:], atol=1e-4, rtol=1e-4
    )


def test_seeded_sampler_strategy_matches_generate(plain):
    batch = prompts()[:2]
    cfgs = [
        SamplingConfig(max_new_tokens=8, do_sample=True, seed=s, ignore_eos=True) for s in (1, 2)
    ]
    sampler = BatchSampler(cfgs, batch, plain.model.vocab_size)
    inf = plain.inferencer
    kv = inf.new_kv(2)
    first = inf.prefill(batch, kv, sampler)
    rest = inf.decode(first.token_ids, kv, 7, sampler)
    got = torch.cat([first.token_ids, rest.token_ids], dim=1).tolist()
    assert got == plain.generate(batch, cfgs).generated_token_ids


def test_lookup():
    h = torch.tensor([1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 2, 3])
    assert lookup(h, 3, max_ngram=2, min_ngram=1) == [4, 9, 1]  # earliest "2 3"
    assert lookup(h, 1, max_ngram=3, min_ngram=3) == []  # "6 2 3" never occurred
    assert lookup(torch.tensor([7, 8, 7]), 5, 3, 1) == [8, 7]
    assert lookup(torch.tensor([7]), 5, 3, 1) == []
    assert lookup(h, 0, 3, 1) == []
    prop = PromptLookupProposer(PromptLookupConfig(max_ngram=2))
    assert isinstance(prop, Proposer)
    out = prop.propose([h.tolist(), [5, 5]], [2, 4])
    assert out.tokens == [[4, 9], [5]] and out.probs == [None, None]


def test_prompt_lookup_accepts_on_copy_task(target_dir, plain):
    """Prompt = a text the model then continues with a copy of: prompt lookup must accept."""
    base = prompts()[0]
    free = plain.generate([base], SamplingConfig(max_new_tokens=30, ignore_eos=True))
    text = base.tolist() + free.generated_token_ids[0]
    prompt = torch.tensor(text + text[: len(base) + 3])  # the model saw this continuation
    spec = LLMModel(
        target_dir,
        dtype=torch.float32,
        load_tokenizer=False,
        spec_config=PromptLookupConfig(num_speculative_tokens=6),
    )
    cfg = SamplingConfig(max_new_tokens=20, ignore_eos=True)
    out = spec.generate([prompt], cfg)
    assert out.generated_token_ids == plain.generate([prompt], cfg).generated_token_ids
    assert out.spec_stats.num_accepted_tokens > 0


def test_stats_accounting():
    a = SpecStats()
    a.record(proposed=3, accepted=2, emitted=3)
    a.record(proposed=0, accepted=0, emitted=1)
    b = SpecStats()
    b.record(proposed=4, accepted=0, emitted=1)
    total = SpecStats.total([a, b])
    assert total.num_steps == 3 and total.num_drafts == 2
    assert total.num_draft_tokens == 7 and total.num_accepted_tokens == 2
    assert total.proposed_per_position == [2, 2, 2, 1]
    assert total.accepted_per_position == [1, 1]
    assert total.acceptance_rate_per_position == [0.5, 0.5, 0.0, 0.0]
    assert total.acceptance_rate == pytest.approx(2 / 7)
    assert total.mean_accepted_length == 1.0 and total.tokens_per_step == pytest.approx(5 / 3)
    d = total.to_dict()
    assert d["num_accepted_tokens"] == 2 and d["acceptance_rate"] == pytest.approx(2 / 7)


def test_lifetime_stats_sum_over_calls(target_dir):
    spec = LLMModel(
        target_dir,
        dtype=torch.float32,
        load_tokenizer=False,
        spec_config={
            "method": "draft",
            "model_name_or_path": target_dir,
            "num_speculative_tokens": 3,
        },
    )
    cfg = SamplingConfig(max_new_tokens=9, ignore_eos=True)
    a = spec.generate(prompts()[:2], cfg).spec_stats
    b = spec.generate(prompts()[:1], cfg).spec_stats
    assert spec.speculator.stats.num_emitted_tokens == a.num_emitted_tokens + b.num_emitted_tokens
    assert a.num_emitted_tokens == 16 and a.acceptance_rate == 1.0
    assert a.proposed_per_position == [a.num_drafts] * 3
