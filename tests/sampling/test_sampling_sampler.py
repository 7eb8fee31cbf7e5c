"""BatchSampler: distributions, per-row seeding, batch changes, logprobs, stop flags."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from pace_core.sampling import (
    BatchSampler,
    SamplingConfig,
    compute_logprobs,
    make_generator,
    sample_from_logits,
)

LOGITS8 = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])

# chi-square critical values at p = 1e-4 by degrees of freedom
CHI2_CRIT = {1: 15.14, 2: 18.42, 3: 21.11, 4: 23.51, 5: 25.74, 6: 27.86, 7: 29.88}


def expected_probs(cfg: SamplingConfig) -> torch.Tensor:
    """Reference distribution: transformers' warpers in HF order, then softmax."""
    procs = LogitsProcessorList()
    if cfg.temperature != 1.0:
        procs.append(TemperatureLogitsWarper(cfg.temperature))
    if cfg.top_k:
        procs.append(TopKLogitsWarper(cfg.top_k))
    if cfg.top_p < 1.0:
        procs.append(TopPLogitsWarper(cfg.top_p))
    if cfg.min_p > 0:
        procs.append(MinPLogitsWarper(cfg.min_p))
    scores = procs(None, LOGITS8[None].clone())
    return torch.softmax(scores[0].double(), dim=-1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"temperature": 0.5},
        {"temperature": 2.0},
        {"top_k": 3},
        {"top_p": 0.8},
        {"min_p": 0.2},
        {"temperature": 0.7, "top_k": 5, "top_p": 0.9},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain",
)
def test_sampled_frequencies_match_distribution(kwargs):
    rows, steps = 2000, 8
    base = SamplingConfig(do_sample=True, **kwargs)
    cfgs = [base.merged(seed=1000 + i) for i in range(rows)]
    sampler = BatchSampler(cfgs, [[0]] * rows, 8)
    logits = LOGITS8.expand(rows, 8).contiguous()
    tokens = torch.cat([sampler.step(logits).tokens for _ in range(steps)])
    counts = torch.bincount(tokens, minlength=8).double()
    n = rows * steps
    probs = expected_probs(base)
    support = probs > 0
    assert counts[~support].sum() == 0, "sampled a filtered-out token"
    exp = probs[support] * n
    chi2 = float(((counts[support] - exp) ** 2 / exp).sum())
    df = int(support.sum()) - 1
    if df == 0:
        assert counts[support].item() == n
    else:
        assert chi2 < CHI2_CRIT[df], (chi2, counts.tolist(), (probs * n).tolist())


def test_sample_from_logits_never_picks_masked_and_handles_one_hot():
    x = torch.full((3, 10), -math.inf)
    x[0, 9] = 0.0
    x[1, 0] = 5.0
    x[2, [3, 4]] = 1.0
    gens = [make_generator(s) for s in range(3)]
    for _ in range(50):
        t = sample_from_logits(x, gens)
        assert t[0] == 9 and t[1] == 0 and t[2] in (3, 4)


def random_logits(steps: int, rows: int, v: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, v, generator=g) * 2 for _ in range(steps)]


MIXED = [
    SamplingConfig(do_sample=True, seed=1, top_p=0.9, repetition_penalty=1.2),
    SamplingConfig(repetition_penalty=1.5, frequency_penalty=0.5),  # greedy
    SamplingConfig(do_sample=True, seed=2, temperature=0.8, top_k=10, presence_penalty=1.0),
    SamplingConfig(do_sample=True, seed=3, min_p=0.1, logit_bias={5: 2.0}),
]
PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]


def test_seeded_runs_are_reproducible():
    steps = random_logits(12, 4, 32)
    a = BatchSampler(MIXED, PROMPTS, 32)
    b = BatchSampler(MIXED, PROMPTS, 32)
    ta = [a.step(x).tokens for x in steps]
    tb = [b.step(x).tokens for x in steps]
    assert all(torch.equal(x, y) for x, y in zip(ta, tb, strict=True))
    c = BatchSampler([cfg.merged(seed=99) if cfg.do_sample else cfg for cfg in MIXED], PROMPTS, 32)
    tc = [c.step(x).tokens for x in steps]
    assert not all(torch.equal(x, y) for x, y in zip(ta, tc, strict=True))


def test_rows_are_independent_of_batch_composition():
    steps = random_logits(10, 4, 32, seed=1)
    batch = BatchSampler(MIXED, PROMPTS, 32)
    batched = torch.stack([batch.step(x).tokens for x in steps])
    for i, cfg in enumerate(MIXED):
        alone = BatchSampler([cfg], [PROMPTS[i]], 32)
        solo = torch.stack([alone.step(x[i : i + 1]).tokens for x in steps])[:, 0]
        assert torch.equal(batched[:, i], solo), i


def test_global_rng_untouched():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    cfgs = [SamplingConfig(do_sample=True), SamplingConfig(do_sample=True, seed=5, top_p=0.5)]
    sampler = BatchSampler(cfgs, [[1], [2]], 16)
    for x in random_logits(5, 2, 16):
        sampler.step(x)
    assert torch.equal(torch.get_rng_state(), before)


def test_unseeded_rows_differ_between_samplers():
    cfg = SamplingConfig(do_sample=True)
    x = torch.zeros(1, 1000)
    draws = {int(BatchSampler([cfg], [[0]], 1000).step(x).tokens) for _ in range(8)}
    assert len(draws) > 1


def test_greedy_rows_in_mixed_batch_take_argmax_of_penalised_logits():
    v = 16
    cfgs = [
        SamplingConfig(repetition_penalty=3.0, temperature=0.1, top_k=1),  # greedy
        SamplingConfig(do_sample=True, seed=0),
        SamplingConfig(do_sample=True, temperature=0.0, seed=0),  # temperature 0 = greedy
    ]
    prompts = [[7], [7], [7]]
    x = torch.zeros(3, v)
    x[:, 7] = 1.0  # best raw token, but penalised (1/3) for row 0
    x[:, 3] = 0.5
    sampler = BatchSampler(cfgs, prompts, v)
    res = sampler.step(x)
    hf = RepetitionPenaltyLogitsProcessor(3.0)(torch.tensor([[7]]), x[0:1].clone())
    assert res.tokens[0] == int(hf.argmax()) == 3
    assert res.tokens[2] == 7
    assert sampler.generators[0] is None and sampler.generators[2] is None


def test_select_rows_and_add_keep_per_row_state():
    v = 32
    first = random_logits(4, 4, v, seed=2)
    sampler = BatchSampler(MIXED, PROMPTS, v)
    hist = [[] for _ in MIXED]
    for x in first:
        for i, t in enumerate(sampler.step(x).tokens.tolist()):
            hist[i].append(t)
    # rows 1 and 3 finish; row 2 before row 0; then a new request joins
    sampler.select_rows(torch.tensor([2, 0]))
    new_cfg = SamplingConfig(do_sample=True, seed=9, frequency_penalty=0.7)
    sampler.add(BatchSampler([new_cfg], [[11, 12]], v))
    assert sampler.batch_size == 3
    assert sampler.state.num_generated.tolist() == [4, 4, 0]
    assert sampler.state.generated(0).tolist() == hist[2]
    assert sampler.state.generated(1).tolist() == hist[0]
    second = random_logits(20, 3, v, seed=3)  # > 16 steps: history capacity grows
    got = torch.stack([sampler.step(x).tokens for x in second])

    # references: each row alone, fed the same per-row logits
    for col, (cfg, prompt, row_first) in enumerate(
        [(MIXED[2], PROMPTS[2], 2), (MIXED[0], PROMPTS[0], 0), (new_cfg, [11, 12], None)]
    ):
        alone = BatchSampler([cfg], [prompt], v)
        if row_first is not None:
            for x in first:
                alone.step(x[row_first : row_first + 1])
        solo = torch.stack([alone.step(x[col : col + 1]).tokens for x in second])[:, 0]
        assert torch.equal(got[:, col], solo), col
        assert torch.equal(alone.state.generated(0), sampler.state.generated(col))

    sampler.select_rows(torch.tensor([False, True, False]))
    assert sampler.batch_size == 1 and sampler.configs[0] is not None
    sampler.select_rows([])
    assert sampler.batch_size == 0
    assert sampler.step(torch.empty(0, v)).tokens.numel() == 0


def test_logprobs_raw_and_top_k_padding():
    v = 20
    cfgs = [
        SamplingConfig(do_sample=True, seed=0, temperature=0.5, logprobs=3),
        SamplingConfig(logprobs=0),
        SamplingConfig(do_sample=True, seed=1),  # no logprobs
        SamplingConfig(logprobs=1, repetition_penalty=2.0),
    ]
    x = random_logits(1, 4, v, seed=4)[0]
    res = BatchSampler(cfgs, [[1]] * 4, v).step(x)
    lp = torch.log_softmax(x, dim=-1)
    assert res.logprobs is not None and res.top_logprobs is not None
    for i in (0, 1, 3):
        torch.testing.assert_close(res.logprobs[i], lp[i, res.tokens[i]])
    assert math.isnan(res.logprobs[2])
    ids, vals = res.top_logprobs
    assert ids.shape == vals.shape == (4, 3)
    ref_vals, ref_ids = lp.topk(3, dim=-1)
    assert torch.equal(ids[0], ref_ids[0])
    torch.testing.assert_close(vals[0], ref_vals[0])
    assert ids[1].tolist() == [-1, -1, -1] and torch.isneginf(vals[1]).all()
    assert ids[2].tolist() == [-1, -1, -1]
    assert ids[3, 0] == ref_ids[3, 0] and ids[3, 1:].tolist() == [-1, -1]


def test_logprobs_off_and_processed_mode():
    x = random_logits(1, 2, 12, seed=5)[0]
    res = BatchSampler([SamplingConfig()] * 2, [[1], [2]], 12).step(x)
    assert res.logprobs is None and res.top_logprobs is None
    cfgs = [SamplingConfig(do_sample=True, seed=3, temperature=0.5, top_k=4, logprobs=2)]
    sampler = BatchSampler(cfgs, [[1]], 12, logprobs_mode="processed")
    processed = sampler.process(x[:1])
    res = sampler.step(x[:1])
    ref = torch.log_softmax(processed, dim=-1)
    torch.testing.assert_close(res.logprobs[0], ref[0, res.tokens[0]])
    assert torch.isfinite(res.top_logprobs[1]).all()


def test_compute_logprobs_for_prompt():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 30, generator=g)
    prompt = torch.tensor([3, 1, 4, 1, 5, 9])
    out = compute_logprobs(logits, prompt[1:], k=4)
    lp = torch.log_softmax(logits, dim=-1)
    torch.testing.assert_close(out.chosen, lp[torch.arange(5), prompt[1:]])
    ref_vals, ref_ids = lp.topk(4, dim=-1)
    assert torch.equal(out.top_ids, ref_ids)
    torch.testing.assert_close(out.top_values, ref_vals)
    assert compute_logprobs(logits, prompt[1:]).top_ids is None


def test_eos_length_and_ignore_eos_flags():
    v = 8
    cfgs = [
        SamplingConfig(max_new_tokens=3),
        SamplingConfig(max_new_tokens=3, ignore_eos=True),
        SamplingConfig(max_new_tokens=3, eos_token_id=6),  # overrides the model's EOS
        SamplingConfig(max_new_tokens=1),
    ]
    sampler = BatchSampler(cfgs, [[1]] * 4, v, eos_token_ids=[2, 7])
    x = torch.zeros(4, v)
    x[:, 2] = 5.0  # model EOS is the argmax everywhere
    res = sampler.step(x)
    assert res.tokens.tolist() == [2, 2, 2, 2]
    assert res.stopped_eos.tolist() == [True, False, False, True]
    assert res.stopped_length.tolist() == [False, False, False, True]
    assert res.finished.tolist() == [True, False, False, True]
    sampler.select_rows([1, 2])
    x = torch.zeros(2, v)
    x[:, 6] = 5.0
    res = sampler.step(x)
    assert res.stopped_eos.tolist() == [False, True]
    res = sampler.step(x)
    assert res.stopped_length.tolist() == [True, True]


def test_per_row_model_eos_and_min_new_tokens():
    v = 8
    cfgs = [SamplingConfig(min_new_tokens=2), SamplingConfig(min_new_tokens=2)]
    sampler = BatchSampler(cfgs, [[1], [1]], v, eos_token_ids=[{3}, {4, 5}])
    assert sampler.configs[1].eos_token_ids == (4, 5)
    x = torch.zeros(2, v)
    x[0, 3] = x[1, 5] = 9.0
    x[:, 1] = 1.0
    toks = [sampler.step(x) for _ in range(3)]
    assert [r.tokens.tolist() for r in toks] == [[1, 1], [1, 1], [3, 5]]
    assert toks[2].stopped_eos.tolist() == [True, True]


def test_bad_inputs():
    with pytest.raises(ValueError, match="configs for"):
        BatchSampler([SamplingConfig()], [], 8)
    with pytest.raises(ValueError, match="logit_bias token ids must be < vocab_size=8"):
        BatchSampler([SamplingConfig(logit_bias={8: 1.0})], [[1]], 8)
    with pytest.raises(ValueError, match="eos_token_id must be < vocab_size=8"):
        BatchSampler([SamplingConfig()], [[1]], 8, eos_token_ids=9)
    with pytest.raises(NotImplementedError, match="beam"):
        BatchSampler([SamplingConfig(num_beams=2)], [[1]], 8)
    with pytest.raises(ValueError, match="logprobs_mode"):
        BatchSampler([], [], 8, logprobs_mode="final")
    sampler = BatchSampler([SamplingConfig()], [[1]], 8)
    with pytest.raises(ValueError, match=r"expected logits of shape \(1, 8\)"):
        sampler.step(torch.zeros(1, 9))
    with pytest.raises(ValueError, match="vocab_size mismatch"):
        sampler.add(BatchSampler([], [], 9))
    with pytest.raises(IndexError):
        sampler.select_rows([3])


def test_input_logits_not_modified_and_bf16_accepted():
    cfgs = [SamplingConfig(do_sample=True, seed=0, top_k=2, repetition_penalty=1.3)]
    x = random_logits(1, 1, 16)[0]
    keep = x.clone()
    BatchSampler(cfgs, [[1, 2]], 16).step(x)
    assert torch.equal(x, keep)
    res = BatchSampler(cfgs, [[1, 2]], 16).step(x.bfloat16())
    assert res.tokens.dtype == torch.long


def test_model_eos_forms():
    for spec in (2, [2], {2}, torch.tensor([2]), [[2], [2]], [None, [2]]):
        sampler = BatchSampler([SamplingConfig(), SamplingConfig()], [[1], [1]], 4, spec)
        assert sampler.configs[1].eos_token_ids == (2,)
    with pytest.raises(ValueError, match="per-row entries"):
        BatchSampler([SamplingConfig()], [[1]], 4, [[2], [3]])
    assert BatchSampler([SamplingConfig()], [[1]], 4, []).configs[0].eos_token_id is None
