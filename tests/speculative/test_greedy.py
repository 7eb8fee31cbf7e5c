"""Greedy speculative decoding equals plain greedy decoding, token for token."""

from __future__ import annotations

import pytest
import torch
from support.spec_models import prompts

from pace_core import LLMModel, SamplingConfig
from pace_core.speculative import (
    DraftSpecDecodeConfig,
    PardSpecDecodeConfig,
    PromptLookupConfig,
)

CACHES = ["dynamic", "bmc", "paged", "slab_pool"]
PROPOSERS = ["prompt_lookup", "draft", "self_draft", "pard", "self_pard"]


def spec_config(name: str, dirs: dict):
    return {
        "prompt_lookup": lambda: PromptLookupConfig(num_speculative_tokens=5, max_ngram=2),
        "draft": lambda: DraftSpecDecodeConfig(dirs["draft"], num_speculative_tokens=3),
        "self_draft": lambda: DraftSpecDecodeConfig(dirs["target"], num_speculative_tokens=4),
        "pard": lambda: PardSpecDecodeConfig(dirs["pard"], num_speculative_tokens=4),
        "self_pard": lambda: PardSpecDecodeConfig(dirs["self_pard"], num_speculative_tokens=3),
    }[name]()


@pytest.fixture(scope="module")
def dirs(target_dir, draft_dir, pard_dir, self_pard_dir):
    return {"target": target_dir, "draft": draft_dir, "pard": pard_dir, "self_pard": self_pard_dir}


@pytest.fixture(scope="module")
def plain(target_dir):
    return LLMModel(target_dir, dtype=torch.float32, load_tokenizer=False)


@pytest.fixture(scope="module")
def references(plain):
    cfg = SamplingConfig(max_new_tokens=24, ignore_eos=True)
    batch = prompts()
    return {
        1: plain.generate(batch[:1], cfg).generated_token_ids,
        8: plain.generate(batch, cfg).generated_token_ids,
    }


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("proposer", PROPOSERS)
def test_greedy_equals_plain(proposer, cache, dirs, target_dir, references):
    spec = LLMModel(
        target_dir,
        dtype=torch.float32,
        load_tokenizer=False,
        kv_cache_type=cache,
        spec_config=spec_config(proposer, dirs),
    )
    cfg = SamplingConfig(max_new_tokens=24, ignore_eos=True)
    batch = prompts()
    for size in (1, 8):
        out = spec.generate(batch[:size], cfg)
        assert out.generated_token_ids == references[size], (proposer, cache, size)
        stats = out.spec_stats
        assert stats.num_emitted_tokens == 23 * size  # the first token comes from the prefill
        assert all(s.spec_stats.num_emitted_tokens == 23 for s in out.sequences)
    if proposer == "self_draft":
        assert stats.acceptance_rate == 1.0
    if proposer == "self_pard":  # mixed accepted lengths across rows
        per_row = {s.spec_stats.num_accepted_tokens for s in out.sequences}
        assert len(per_row) > 1 and 0 < stats.acceptance_rate < 1


def test_mixed_max_new_tokens_rows_finish_independently(dirs, target_dir, plain):
    batch = prompts()
    cfgs = [SamplingConfig(max_new_tokens=n, ignore_eos=True) for n in (3, 17, 1, 9, 24, 2, 11, 5)]
    want = plain.generate(batch, cfgs).generated_token_ids
    for name in ("self_draft", "self_pard", "prompt_lookup"):
        spec = LLMModel(
            target_dir,
            dtype=torch.float32,
            load_tokenizer=False,
            spec_config=spec_config(name, dirs),
        )
        out = spec.generate(batch, cfgs)
        assert out.generated_token_ids == want, name
        assert [len(t) for t in out.generated_token_ids] == [c.max_new_tokens for c in cfgs]


def test_penalties_and_logprobs_match_plain(dirs, target_dir, plain):
    """Greedy with state-dependent processors (repetition / frequency penalty, min_new_tokens,
    logit bias) and logprobs: the speculative path reproduces plain decoding."""
    batch = prompts()[:4]
    cfg = SamplingConfig(
        max_new_tokens=16,
        repetition_penalty=1.3,
        frequency_penalty=0.5,
        logit_bias={5: 2.0},
        min_new_tokens=4,
        eos_token_id=[9, 11],
        logprobs=3,
    )
    want = plain.generate(batch, cfg, output_logits=True)
    spec = LLMModel(
        target_dir,
        dtype=torch.float32,
        load_tokenizer=False,
        spec_config=spec_config("self_draft", dirs),
    )
    got = spec.generate(batch, cfg, output_logits=True)
    assert got.generated_token_ids == want.generated_token_ids
    assert got.finish_reasons == want.finish_reasons
    for a, b in zip(got.logits, want.logits):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for sa, sb in zip(got.sequences, want.sequences):
        for la, lb in zip(sa.logprobs, sb.logprobs):
            assert la.token_id == lb.token_id and la.logprob == pytest.approx(lb.logprob, abs=1e-4)
            assert list(la.top) == list(lb.top)


def test_stream_matches_plain(dirs, target_dir, plain):
    batch = prompts()[:3]
    cfg = SamplingConfig(max_new_tokens=10, ignore_eos=True)
    spec = LLMModel(
        target_dir,
        dtype=torch.float32,
        load_tokenizer=False,
        spec_config=spec_config("self_draft", dirs),
    )
    rows = [[] for _ in batch]
    for chunk in spec.stream(batch, cfg):
        rows[chunk.index].append(chunk.token_id)
    assert rows == plain.generate(batch, cfg).generated_token_ids
