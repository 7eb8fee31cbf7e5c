"""KV rollback consistency, max_new_tokens / context limits, EOS and stop strings mid-run."""

from __future__ import annotations

import pytest
import torch
from support.spec_models import MAX_POS, prompts

from pace_core import LLMModel, SamplingConfig
from pace_core.engine.core import EngineCore
from pace_core.engine.events import SeqSpec, Token
from pace_core.engine.offline import OFFLINE_ENGINE
from pace_core.models.decoder import prefill
from pace_core.speculative import DraftSpecDecodeConfig, PardSpecDecodeConfig, PromptLookupConfig

CACHES = ["dynamic", "bmc", "paged", "slab_pool"]


def fresh_kv(llm: LLMModel, tokens: list[int]):
    """Per-layer (K, V) of a fresh prefill of ``tokens``."""
    cache = llm.new_cache()
    (sid,) = cache.add_sequences(1)
    prefill(llm.model, cache, [sid], [torch.tensor(tokens)])
    return cache.get_kv_states(sid)


def assert_kv_equal(got, want) -> None:
    assert len(got) == len(want)
    for (k1, v1), (k2, v2) in zip(got, want):
        torch.testing.assert_close(k1, k2, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(v1, v2, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("method", ["draft", "self_pard"])
def test_caches_consistent_after_every_round(method, cache, target_dir, draft_dir, self_pard_dir):
    """After each round the target cache equals a fresh prefill of the history minus its last
    token, and the draft cache one of the tokens it claims to hold (a prefix of the history)."""
    spec_cfg = {
        "draft": DraftSpecDecodeConfig(draft_dir, num_speculative_tokens=3),
        "self_pard": PardSpecDecodeConfig(self_pard_dir, num_speculative_tokens=3),
    }[method]
    llm = LLMModel(
        target_dir,
        dtype=torch.float32,
        load_tokenizer=False,
        kv_cache_type=cache,
        spec_config=spec_cfg,
    )
    draft = llm.speculator.draft
    batch = prompts()[:4]
    cfgs = [SamplingConfig(max_new_tokens=n, ignore_eos=True) for n in (12, 7, 12, 3)]
    core = EngineCore(llm.handle, OFFLINE_ENGINE, cache=llm.new_cache(), offline=True)
    core.submit([SeqSpec(str(i), p.tolist(), c) for i, (p, c) in enumerate(zip(batch, cfgs))])
    rounds, emitted = [], 0

    def check() -> None:
        proposer = core.spec.proposer
        for i, req in enumerate(core.scheduler.running):
            history = req.prompt.tolist() + req.tokens
            assert core.cache.get_num_tokens(req.seq_id) == len(history) - 1
            assert_kv_equal(core.cache.get_kv_states(req.seq_id), fresh_kv(llm, history[:-1]))
            if proposer.kv is None or len(req.tokens) == 1:  # no draft round yet
                continue
            held = proposer.held[i]
            assert held == history[: len(held)] and len(held) >= len(history) - 2
            assert proposer.kv.get_num_tokens()[i] == len(held)
            assert_kv_equal(proposer.kv.get_kv_states(i), fresh_kv(draft, held))
        rounds.append(len(core.scheduler.running))

    with torch.inference_mode():
        for events in core.drive():
            emitted += sum(isinstance(e, Token) for e in events)
            check()
    assert emitted == sum(c.max_new_tokens for c in cfgs)
    assert len(rounds) > 3 and rounds[-1] == 0


@pytest.mark.parametrize("method", ["self_draft", "prompt_lookup", "self_pard"])
def test_never_exceeds_max_new_tokens_or_context(method, target_dir, self_pard_dir):
    spec_cfg = {
        "self_draft": DraftSpecDecodeConfig(target_dir, num_speculative_tokens=8),
        "prompt_lookup": PromptLookupConfig(num_speculative_tokens=8, max_ngram=1),
        "self_pard": PardSpecDecodeConfig(self_pard_dir, num_speculative_tokens=8),
    }[method]
    plain = LLMModel(target_dir, dtype=torch.float32, load_tokenizer=False)
    spec = LLMModel(target_dir, dtype=torch.float32, load_tokenizer=False, spec_config=spec_cfg)
    batch = prompts()[:3]
    for n in (1, 2, 3, 5, 9, 10):
        cfg = SamplingConfig(max_new_tokens=n, ignore_eos=True)
        out = spec.generate(batch, cfg)
        assert [len(t) for t in out.generated_token_ids] == [n] * 3
        assert out.generated_token_ids == plain.generate(batch, cfg).generated_token_ids
        assert out.finish_reasons == ["length"] * 3
    # the context window: the last rows of the window are filled, never passed
    long = [torch.arange(MAX_POS - 6) % 100, torch.arange(MAX_POS - 20) % 97]
    cfg = SamplingConfig(max_new_tokens=40, ignore_eos=True)
    out = spec.generate(long, cfg)
    want = plain.generate(long, cfg)
    assert out.generated_token_ids == want.generated_token_ids
    assert [len(t) for t in out.generated_token_ids] == [6, 20]


def test_eos_inside_accepted_run_ends_the_row(target_dir):
    """With a self-draft every draft is accepted: an EOS in the middle of a run must end the
    sequence there, the accepted tokens after it dropped."""
    plain = LLMModel(target_dir, dtype=torch.float32, load_tokenizer=False)
    spec = LLMModel(
        target_dir,
        dtype=torch.float32,
        load_tokenizer=False,
        spec_config=DraftSpecDecodeConfig(target_dir, num_speculative_tokens=6),
    )
    batch = prompts()[:4]
    free = plain.generate(batch, SamplingConfig(max_new_tokens=20, ignore_eos=True))
    first = free.generated_token_ids[0]
    eos = next(t for i, t in enumerate(first) if i >= 3 and t not in first[:i])
    cfg = SamplingConfig(max_new_tokens=20, eos_token_id=eos)
    want = plain.generate(batch, cfg)
    got = spec.generate(batch, cfg)
    assert got.generated_token_ids == want.generated_token_ids
    assert got.finish_reasons == want.finish_reasons
    assert got.sequences[0].token_ids[-1] == eos and got.finish_reasons[0] == "stop"
    assert 3 < len(got.sequences[0].token_ids) < 20
    stats = got.sequences[0].spec_stats
    assert stats.num_emitted_tokens < stats.num_accepted_tokens + stats.num_steps  # trimmed


def test_stop_string_inside_accepted_run(target_dir, word_tokenizer):
    plain = LLMModel(target_dir, dtype=torch.float32, tokenizer=word_tokenizer)
    spec = LLMModel(
        target_dir,
        dtype=torch.float32,
        tokenizer=word_tokenizer,
        spec_config=DraftSpecDecodeConfig(target_dir, num_speculative_tokens=6),
    )
    batch = prompts()[:2]
    free = plain.generate(batch, SamplingConfig(max_new_tokens=20, ignore_eos=True))
    words = free.texts[0].split()
    stop = next(w for i, w in enumerate(words) if i >= 4 and w not in words[:i])
    cfg = SamplingConfig(max_new_tokens=20, ignore_eos=True, stop=[f" {stop}"])
    want = plain.generate(batch, cfg)
    got = spec.generate(batch, cfg)
    assert got.generated_token_ids == want.generated_token_ids
    assert got.texts == want.texts and got.finish_reasons == want.finish_reasons
    assert got.finish_reasons[0] == "stop" and stop not in got.texts[0]
    assert len(got.sequences[0].token_ids) < 20
