"""Parity with transformers on real weights (SmolLM2-135M; Gemma-3-270M under `slow`)."""

from __future__ import annotations

import pytest
import torch
from support.parity import topk_rule_ok
from transformers import AutoModelForCausalLM, AutoTokenizer

from pace_core import LLMModel, SamplingConfig

PROMPTS = [
    "Once upon a time, there was a little",
    "The capital of France is",
    "def fibonacci(n):",
    "List three colors:",
    "In 1969, astronauts",
    "The quick brown fox",
    "Water boils at",
    "My favourite recipe for pancakes starts with",
]


def hf_greedy(model, tok, prompt: str, n: int) -> list[int]:
    ids = tok(prompt, return_tensors="pt")
    out = model.generate(**ids, do_sample=False, max_new_tokens=n, min_new_tokens=n)
    return out[0, ids["input_ids"].shape[1] :].tolist()


def check_bf16(path, prompts, n):
    """bf16 greedy: each token must be a near-tie choice under the fp32 HF reference."""
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    pace = LLMModel(path, dtype=torch.bfloat16)
    for prompt in prompts:
        got = pace.generate(prompt, SamplingConfig(max_new_tokens=n, ignore_eos=True))
        ids = torch.tensor([got.sequences[0].prompt_token_ids + got.sequences[0].token_ids])
        with torch.no_grad():
            ref = hf(ids).logits[0]
        start = len(got.sequences[0].prompt_token_ids) - 1
        for t, token in enumerate(got.sequences[0].token_ids):
            assert topk_rule_ok(ref[start + t], token), (prompt, t, token)


@pytest.fixture(scope="module")
def smol(smollm2_dir):
    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    return hf, tok, LLMModel(smollm2_dir, dtype=torch.float32)


def test_smollm2_fp32_greedy_64_matches_transformers(smol):
    hf, tok, pace = smol
    for prompt in PROMPTS[:2]:
        want = hf_greedy(hf, tok, prompt, 64)
        got = pace.generate(prompt, SamplingConfig(max_new_tokens=64, min_new_tokens=64))
        assert got.sequences[0].token_ids == want, prompt
    assert (
        pace.generate(PROMPTS[0], SamplingConfig(max_new_tokens=12))
        .texts[0]
        .startswith(" girl named Emma who loved to play in the sun")
    )


def test_smollm2_fp32_logits_match(smol):
    hf, tok, pace = smol
    enc = tok(PROMPTS[:3], return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        ref = hf(**enc).logits
    got = pace.logits(enc)
    mask = enc["attention_mask"].bool()
    assert (ref[mask] - got[mask]).abs().max() < 1e-3


def test_smollm2_batch_of_8_mixed_lengths_equals_single(smol):
    _hf, tok, pace = smol
    cfg = SamplingConfig(max_new_tokens=16, ignore_eos=True)
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    batch = pace.generate(enc, cfg)
    assert batch.output_token_ids.shape == (8, enc["input_ids"].shape[1] + 16)
    for i, prompt in enumerate(PROMPTS):
        single = pace.generate(prompt, cfg).sequences[0].token_ids
        assert batch.sequences[i].token_ids == single, prompt


def test_smollm2_bf16_within_topk_rule(smollm2_dir):
    check_bf16(smollm2_dir, PROMPTS[:2], 32)


@pytest.mark.slow
def test_gemma3_fp32_greedy_64_matches_transformers(gemma3_dir):
    hf = AutoModelForCausalLM.from_pretrained(str(gemma3_dir), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(gemma3_dir))
    pace = LLMModel(gemma3_dir, dtype=torch.float32)
    for prompt in PROMPTS[:3]:
        want = hf_greedy(hf, tok, prompt, 64)
        got = pace.generate(prompt, SamplingConfig(max_new_tokens=64, min_new_tokens=64))
        assert got.sequences[0].token_ids == want, prompt
    text = pace.generate("The capital of France is", SamplingConfig(max_new_tokens=10)).texts[0]
    assert text.startswith(" the capital of the country of France")


@pytest.mark.slow
def test_gemma3_bf16_within_topk_rule(gemma3_dir):
    check_bf16(gemma3_dir, PROMPTS[:2], 32)


@pytest.mark.slow
def test_smollm2_fp32_batch_8_greedy_64_matches_transformers(smol):
    hf, tok, pace = smol
    for prompt in PROMPTS:
        want = hf_greedy(hf, tok, prompt, 64)
        got = pace.generate(prompt, SamplingConfig(max_new_tokens=64, min_new_tokens=64))
        assert got.sequences[0].token_ids == want, prompt


def test_smollm2_stop_strings_stream_and_chat(smol):
    _hf, _tok, pace = smol
    full = pace.generate(PROMPTS[0], SamplingConfig(max_new_tokens=24)).texts[0]
    assert " Emma" in full
    cfg = SamplingConfig(max_new_tokens=24, stop=[" Emma", "zzz"])
    out = pace.generate(PROMPTS[0], cfg)
    assert out.texts[0] == full[: full.index(" Emma")] and out.finish_reasons == ["stop"]
    streamed = "".join(c.text for c in pace.stream(PROMPTS[0], cfg))
    assert streamed == out.texts[0]
    plain = "".join(c.text for c in pace.stream(PROMPTS[0], SamplingConfig(max_new_tokens=24)))
    assert plain == full
    chat = pace.generate(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingConfig(max_new_tokens=12),
    )
    assert "Paris" in chat.texts[0]


def test_smollm2_greedy_identical_across_cache_types(smollm2_dir, smol):
    _, tok, pace = smol
    enc = tok(PROMPTS[:4], return_tensors="pt", padding=True, padding_side="left")
    cfg = SamplingConfig(max_new_tokens=24, ignore_eos=True)
    want = pace.generate(enc, cfg).generated_token_ids
    for cache in ("bmc", "paged", "slab_pool"):
        other = LLMModel(smollm2_dir, dtype=torch.float32, kv_cache_type=cache)
        assert other.generate(enc, cfg).generated_token_ids == want, cache
