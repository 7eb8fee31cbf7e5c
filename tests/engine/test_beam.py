"""Beam search parity with transformers' ``generate(num_beams=...)`` on a tiny random Llama."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import pace_core
from pace_core.engine.beam import BeamHypothesis, beam_search
from pace_core.sampling.config import SamplingConfig

PROMPT = [5, 17, 42, 9, 77, 23, 64]
SHORT = [88, 12, 31, 7]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.manual_seed(1234)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      bos_token_id=1, eos_token_id=2)  # fmt: skip
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    path = tmp_path_factory.mktemp("beam_llama")
    hf.save_pretrained(path)
    pace = pace_core.LLMModel(path, dtype=torch.float32, load_tokenizer=False)
    return hf, pace


@pytest.fixture(scope="module")
def eos_id(models) -> int:
    """A token HF's greedy output emits at step 3..6 (and not before), so beams can finish."""
    hf, _ = models
    out = hf.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=8,
                      eos_token_id=None, pad_token_id=0)[0, len(PROMPT):].tolist()  # fmt: skip
    for step in range(3, 7):
        if out[step] not in out[:step]:
            return out[step]
    pytest.fail(f"no fresh token at steps 3..6 of the greedy output {out}")


def _hf(hf, prompts, eos, nrs, **kw):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = hf.generate(ids, attention_mask=mask, do_sample=False, num_return_sequences=nrs,
                      eos_token_id=eos, pad_token_id=0, output_scores=True,
                      return_dict_in_generate=True, **kw)  # fmt: skip
    return out.sequences[:, width:], out.sequences_scores


def _pace(pace, prompts, eos, nrs, **kw):
    """pace beam search; ``early_stopping="never"`` goes through the override argument."""
    es = kw.pop("early_stopping", False)
    cfg = SamplingConfig(**kw, early_stopping=es is True)
    return beam_search(pace.model, pace.new_cache, [torch.tensor(p) for p in prompts], cfg,
                       eos, num_return_sequences=nrs, early_stopping=es)  # fmt: skip


def _assert_same(hyps: list[list[BeamHypothesis]], seqs, scores, eos: list[int]) -> None:
    flat = [h for per_prompt in hyps for h in per_prompt]
    assert len(flat) == seqs.shape[0]
    fill = eos[0]
    for h, row, score in zip(flat, seqs.tolist(), scores.tolist()):
        n = len(h.token_ids)
        assert h.token_ids == row[:n], (h.token_ids, row)
        assert all(t == fill for t in row[n:]), (h.token_ids, row)
        assert h.score == pytest.approx(score, abs=1e-4)


CASES = [
    dict(num_beams=2, length_penalty=1.0, early_stopping=False, nrs=1),
    dict(num_beams=4, length_penalty=1.0, early_stopping=True, nrs=2),
    dict(num_beams=4, length_penalty=0.5, early_stopping=False, nrs=2),
    dict(num_beams=4, length_penalty=2.0, early_stopping=True, nrs=1),
    dict(num_beams=2, length_penalty=2.0, early_stopping=False, nrs=2),
    dict(num_beams=3, length_penalty=0.5, early_stopping=True, nrs=3),
    dict(num_beams=4, length_penalty=1.0, early_stopping="never", nrs=2),
    dict(num_beams=2, length_penalty=2.0, early_stopping="never", nrs=2),
    dict(num_beams=4, length_penalty=1.0, early_stopping=False, nrs=2, repetition_penalty=1.3),
    dict(num_beams=4, length_penalty=1.0, early_stopping=True, nrs=2, min_new_tokens=6),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_matches_hf(models, eos_id, case):
    hf, pace = models
    case = dict(case)
    nrs = case.pop("nrs")
    kw = dict(max_new_tokens=12, **case)
    seqs, scores = _hf(hf, [PROMPT], [eos_id], nrs, **kw)
    hyps = _pace(pace, [PROMPT], [eos_id], nrs, **kw)
    _assert_same(hyps, seqs, scores, [eos_id])


def test_eos_hypotheses_are_exercised(models, eos_id):
    """The chosen EOS really finishes beams (early), so the finished-hypothesis logic matters."""
    _, pace = models
    hyps = _pace(pace, [PROMPT], [eos_id], 4, num_beams=4, max_new_tokens=12)
    assert any(h.token_ids[-1] == eos_id and len(h.token_ids) < 12 for h in hyps[0])


def test_two_eos_ids(models, eos_id):
    hf, pace = models
    eos = [eos_id, 7]
    kw = dict(num_beams=3, max_new_tokens=10, length_penalty=1.0, early_stopping=False)
    seqs, scores = _hf(hf, [PROMPT], eos, 3, **kw)
    _assert_same(_pace(pace, [PROMPT], eos, 3, **kw), seqs, scores, eos)


def test_batch_equals_single_and_hf(models, eos_id):
    hf, pace = models
    kw = dict(num_beams=3, max_new_tokens=10, length_penalty=1.0, early_stopping=False)
    batch = _pace(pace, [PROMPT, SHORT], [eos_id], 2, **kw)
    alone = [_pace(pace, [p], [eos_id], 2, **kw)[0] for p in (PROMPT, SHORT)]
    assert [[h.token_ids for h in r] for r in batch] == [[h.token_ids for h in r] for r in alone]
    for rb, ra in zip(batch, alone):
        for hb, ha in zip(rb, ra):
            assert hb.score == pytest.approx(ha.score, abs=1e-5)
    seqs, scores = _hf(hf, [PROMPT, SHORT], [eos_id], 2, **kw)
    _assert_same(batch, seqs, scores, [eos_id])


def test_rejects_sampling_and_too_many_returns(models):
    _, pace = models
    prompt = [torch.tensor(PROMPT)]
    with pytest.raises(ValueError, match="do_sample"):
        beam_search(pace.model, pace.new_cache, prompt, SamplingConfig(do_sample=True), [2])
    with pytest.raises(ValueError, match="num_return_sequences"):
        beam_search(pace.model, pace.new_cache, prompt, SamplingConfig(num_beams=2), [2],
                    num_return_sequences=3)  # fmt: skip
