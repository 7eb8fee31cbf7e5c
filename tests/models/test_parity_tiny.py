"""fp32 parity with transformers on tiny random checkpoints of every family (see ``tiny.py``).

Per variant: full-prompt logits, 20 greedy tokens with their per-step logits, and a left-padded
batch of three prompts against the same prompts alone (and against HF's padded forward).
"""

from __future__ import annotations

import pytest
import torch
from support.parity import topk_rule_ok
from support.tiny import FACTORIES
from transformers import AutoModelForCausalLM

from pace_core import LLMModel, SamplingConfig

ATOL = 1e-4
NEW_TOKENS = 20
LOGITS_LEN = 32  # > every variant's rope threshold (dynamic 30, yarn/longrope/llama3 16)
PROMPT_LEN = 8  # 8 + 20 crosses the 16-token longrope threshold and every sliding window
BATCH_LENS = (5, 8, 11)
# Extra greedy prompt lengths per variant: phi3-longrope also starts past its 16-token threshold.
EXTRA_PROMPT_LENS = {"phi3-longrope": (18,)}
# Known engine gaps: (variant, prompt length) -> reason. The test xfails while the gap is there
# and fails once it is fixed, so the entry gets removed.
KNOWN_GAPS: dict[tuple[str, int], str] = {}


def prompt(length: int, vocab: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + length)
    return torch.randint(3, vocab, (length,), generator=gen)


@pytest.fixture(scope="session", params=list(FACTORIES))
def models(request, tmp_path_factory):
    """(variant name, HF model, pace model), built once per session."""
    path = FACTORIES[request.param](tmp_path_factory.mktemp(request.param))
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    pace = LLMModel(path, dtype=torch.float32, load_tokenizer=False)
    return request.param, hf, pace


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def test_prompt_logits(models):
    _, hf, pace = models
    ids = prompt(LOGITS_LEN, hf.config.vocab_size).view(1, -1)
    with torch.no_grad():
        ref = hf(ids).logits
    got = pace.logits(ids)
    assert got.shape == ref.shape
    assert max_diff(got, ref) < ATOL


def greedy_mismatch(hf, pace, length: int) -> str | None:
    """None when pace's 20 greedy tokens and per-step logits match HF's, else what differs."""
    ids = prompt(length, hf.config.vocab_size).view(1, -1)
    with torch.no_grad():
        ref = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    out = pace.generate(
        ids, SamplingConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True), output_logits=True
    )
    ref_tokens, ref_logits = ref.sequences[0, length:].tolist(), torch.cat(ref.logits)
    if out.sequences[0].token_ids != ref_tokens:
        return f"tokens {out.sequences[0].token_ids} != HF {ref_tokens}"
    if out.logits[0].shape != ref_logits.shape:
        return f"logits shape {tuple(out.logits[0].shape)} != HF {tuple(ref_logits.shape)}"
    diff = max_diff(out.logits[0], ref_logits)
    return None if diff < ATOL else f"step logits differ by {diff:.2e}"


def test_greedy_and_step_logits(models):
    name, hf, pace = models
    for length in (*EXTRA_PROMPT_LENS.get(name, ()), PROMPT_LEN):
        problem = greedy_mismatch(hf, pace, length)
        gap = KNOWN_GAPS.get((name, length))
        if gap is None:
            assert problem is None, f"prompt of {length}: {problem}"
        elif problem is None:
            pytest.fail(f"known gap fixed, remove it from KNOWN_GAPS: {gap}")
        else:
            pytest.xfail(f"{gap} ({problem})")


def _left_padded(prompts: list[torch.Tensor], pad: int = 0) -> dict[str, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = p
        mask[i, width - len(p) :] = 1
    return {"input_ids": ids, "attention_mask": mask}


# Families whose transformers forward counts left pads as positions somewhere: Llama 4's
# attention temperature uses the cache length, not position_ids.
HF_COUNTS_PADS = ("llama4_text",)


def test_left_padded_batch(models):
    _, hf, pace = models
    prompts = [prompt(n, hf.config.vocab_size, seed=7) for n in BATCH_LENS]
    batch = _left_padded(prompts)
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    together = pace.generate(batch, sampling).generated_token_ids
    alone = [pace.generate(p.view(1, -1), sampling).generated_token_ids[0] for p in prompts]
    assert together == alone

    # Real-token logits of the padded batch match HF's (positions from the mask, as generate).
    mask = batch["attention_mask"]
    real = mask.bool()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        if hf.config.model_type in HF_COUNTS_PADS:  # HF's own batch differs: each row alone
            ref = torch.cat([hf(p.view(1, -1)).logits[0] for p in prompts])
        else:
            ref = hf(**batch, position_ids=positions).logits[real]
    got = pace.logits(batch)
    assert max_diff(got[real], ref) < ATOL


@pytest.mark.parametrize("cache", ["bmc", "paged", "slab_pool"])
def test_every_cache_gives_the_hf_greedy_tokens(models, cache):
    """The same checkpoint through each other KV cache type: HF's greedy tokens and step
    logits (the default ``dynamic`` is checked above)."""
    name, hf, pace = models
    other = LLMModel(pace.path, dtype=torch.float32, kv_cache_type=cache, load_tokenizer=False)
    problem = greedy_mismatch(hf, other, PROMPT_LEN)
    assert problem is None, f"{name} on {cache}: {problem}"


def test_bf16_greedy_within_near_ties(models):
    """bf16: every greedy token is a near-tie choice of the fp32 HF reference on the same
    sequence (top-5 and within 0.5 nats of the best: ``support.parity.topk_rule_ok``)."""
    _, hf, _ = models
    pace = LLMModel(hf.name_or_path, dtype=torch.bfloat16, load_tokenizer=False)
    ids = prompt(PROMPT_LEN, hf.config.vocab_size).view(1, -1)
    out = pace.generate(ids, SamplingConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True))
    tokens = out.sequences[0].token_ids
    with torch.no_grad():
        ref = hf(torch.cat([ids[0], torch.tensor(tokens)]).view(1, -1)).logits[0]
    for t, token in enumerate(tokens):
        assert topk_rule_ok(ref[PROMPT_LEN - 1 + t], token), f"step {t}: token {token}"
