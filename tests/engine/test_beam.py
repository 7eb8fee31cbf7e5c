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


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny matrices: one intra-op thread is as fast and does not thrash on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.manual_seed(1234)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
    )
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
    out = hf.generate(
        torch.tensor([PROMPT]), do_sample=False, max_new_tokens=8, eos_token_id=None, pad_token_id=0
    )[0, len(PROMPT) :].tolist()
    for step in range(3, 7):
        if out[step] not in out[:step]:
            return out[step]
    pytest.fail(f"no fresh token at steps 3..6 of the greedy output {out}")


@pytest.fixture(scope="module")
def early_eos(models) -> int:
    """HF's first greedy token: beams finish from step 1, so the search can end early."""
    hf, _ = models
    return int(
        hf.generate(
            torch.tensor([PROMPT]),
            do_sample=False,
            max_new_tokens=1,
            eos_token_id=None,
            pad_token_id=0,
        )[0, -1]
    )


@pytest.fixture
def forwards(models, monkeypatch) -> list[int]:
    """Rows of every pace decoder forward pass (prefill included)."""
    _, pace = models
    rows: list[int] = []
    forward = pace.model.forward

    def counting(ids, step, **kw):
        rows.append(ids.shape[0])
        return forward(ids, step, **kw)

    monkeypatch.setattr(pace.model, "forward", counting)
    return rows


def _hf(hf, prompts, eos, nrs, **kw):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = hf.generate(
        ids,
        attention_mask=mask,
        do_sample=False,
        num_return_sequences=nrs,
        eos_token_id=eos,
        pad_token_id=0,
        output_scores=True,
        return_dict_in_generate=True,
        **kw,
    )
    return out.sequences[:, width:], out.sequences_scores


def _pace(pace, prompts, eos, nrs, **kw):
    """pace beam search; ``early_stopping="never"`` goes through the override argument."""
    es = kw.pop("early_stopping", False)
    cfg = SamplingConfig(**kw, early_stopping=es is True)
    return beam_search(
        pace.model,
        pace.new_cache,
        [torch.tensor(p) for p in prompts],
        cfg,
        eos,
        num_return_sequences=nrs,
        early_stopping=es,
    )


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


EARLY_CASES = [
    dict(num_beams=2, length_penalty=1.0, early_stopping=False, nrs=2),
    dict(num_beams=2, length_penalty=2.0, early_stopping=False, nrs=1),
    dict(num_beams=2, length_penalty=0.5, early_stopping="never", nrs=2),
    dict(num_beams=2, length_penalty=1.0, early_stopping="never", nrs=2),
    dict(num_beams=3, length_penalty=1.0, early_stopping=True, nrs=3),
    dict(num_beams=3, length_penalty=1.0, early_stopping=False, nrs=3),
    dict(num_beams=4, length_penalty=2.0, early_stopping=True, nrs=2),
]


@pytest.mark.parametrize(
    "case", EARLY_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items())
)
def test_matches_hf_early_stop(models, early_eos, case):
    """With an EOS that is likely from step 1, early_stopping / the heuristic end the search."""
    hf, pace = models
    case = dict(case)
    nrs = case.pop("nrs")
    kw = dict(max_new_tokens=12, **case)
    seqs, scores = _hf(hf, [PROMPT], [early_eos], nrs, **kw)
    _assert_same(_pace(pace, [PROMPT], [early_eos], nrs, **kw), seqs, scores, [early_eos])


def test_early_stop_paths_are_exercised(models, early_eos, forwards):
    """Guards the coverage of the cases above: each stopping rule really ends a search early."""
    _, pace = models
    steps = {}
    for es, nb in ((True, 3), (False, 3), (False, 2), ("never", 2)):
        forwards.clear()
        _pace(pace, [PROMPT], [early_eos], 1, num_beams=nb, max_new_tokens=12, early_stopping=es)
        steps[es, nb] = len(forwards)
    assert steps[True, 3] < steps[False, 3]  # all beams finished vs heuristic
    assert steps[False, 2] < 12  # heuristic: the running beams cannot win any more
    assert steps["never", 2] > steps[False, 2]


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


@pytest.mark.parametrize("early", [False, True])
def test_batch_equals_single_and_hf(models, eos_id, early_eos, forwards, early):
    """Left-padded prompts of different lengths give what each gives alone (and what HF gives);
    with ``early`` the first prompt finishes before the other and leaves the batch."""
    hf, pace = models
    eos_id = early_eos if early else eos_id
    kw = dict(num_beams=3, max_new_tokens=10, length_penalty=1.0, early_stopping=early)
    batch = _pace(pace, [PROMPT, SHORT], [eos_id], 2, **kw)
    assert (min(forwards[1:]) < 6) == early  # 2 prompts x 3 beams, unless one left
    alone = [_pace(pace, [p], [eos_id], 2, **kw)[0] for p in (PROMPT, SHORT)]
    assert [[h.token_ids for h in r] for r in batch] == [[h.token_ids for h in r] for r in alone]
    for rb, ra in zip(batch, alone):
        for hb, ha in zip(rb, ra):
            assert hb.score == pytest.approx(ha.score, abs=1e-5)
    seqs, scores = _hf(hf, [PROMPT, SHORT], [eos_id], 2, **kw)
    _assert_same(batch, seqs, scores, [eos_id])


@pytest.mark.parametrize("kv_cache_type", ["paged", "slab_pool", "bmc"])
def test_cache_types(models, early_eos, kv_cache_type):
    """Block caches fork beams into fresh blocks on reorder; results equal the dynamic cache."""
    _, pace = models
    other = pace_core.LLMModel(
        pace.path, dtype=torch.float32, load_tokenizer=False, kv_cache_type=kv_cache_type
    )
    kw = dict(num_beams=3, max_new_tokens=8, early_stopping=True)
    want = _pace(pace, [PROMPT, SHORT], [early_eos], 2, **kw)
    got = _pace(other, [PROMPT, SHORT], [early_eos], 2, **kw)
    assert [[h.token_ids for h in r] for r in got] == [[h.token_ids for h in r] for r in want]
    for rg, rw in zip(got, want):
        assert [h.score for h in rg] == pytest.approx([h.score for h in rw], abs=1e-5)


def test_longrope_reprefill_matches_hf(tmp_path):
    """Phi-3 LongRoPE: beams crossing the original length recompute their keys, as in HF."""
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(7)
    rope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "original_max_position_embeddings": 16,
        "short_factor": [1.0, 1.2, 1.5, 2.0],
        "long_factor": [1.0, 2.0, 4.0, 8.0],
    }
    cfg = Phi3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        original_max_position_embeddings=16,
        rope_parameters=rope,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    hf = Phi3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    hf.save_pretrained(tmp_path)
    pace = pace_core.LLMModel(tmp_path, dtype=torch.float32, load_tokenizer=False)
    assert pace.model.reprefill_at == 16
    kw = dict(num_beams=3, max_new_tokens=14, length_penalty=1.0, early_stopping=False)
    seqs, scores = _hf(hf, [PROMPT], [127], 2, **kw)
    _assert_same(_pace(pace, [PROMPT], [127], 2, **kw), seqs, scores, [127])


def test_rejects_sampling_and_too_many_returns(models):
    _, pace = models
    prompt = [torch.tensor(PROMPT)]
    with pytest.raises(ValueError, match="do_sample"):
        beam_search(pace.model, pace.new_cache, prompt, SamplingConfig(do_sample=True), [2])
    with pytest.raises(ValueError, match="num_return_sequences"):
        beam_search(
            pace.model,
            pace.new_cache,
            prompt,
            SamplingConfig(num_beams=2),
            [2],
            num_return_sequences=3,
        )


def test_generate_with_num_beams_returns_the_best_beam(tiny_llama_dir):
    from pace_core import LLMModel, SamplingConfig

    model = LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False)
    cfg = SamplingConfig(max_new_tokens=6, num_beams=3)
    out = model.generate(torch.tensor([[5, 6, 7]]), cfg)
    best = model.beam_search(torch.tensor([[5, 6, 7]]), cfg, num_return_sequences=2)[0]
    assert out.sequences[0].token_ids == best[0].token_ids
    assert best[0].score >= best[1].score
    assert out.output_token_ids[0, :3].tolist() == [5, 6, 7]
