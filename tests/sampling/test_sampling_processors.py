"""Batched processors equal transformers' per-row logits processors on the same inputs."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from pace_core.sampling.config import SamplingConfig
from pace_core.sampling.processors import (
    BUILTIN_PROCESSORS,
    FrequencyPresencePenaltyProcessor,
    LogitBiasProcessor,
    MinNewTokensProcessor,
    MinPProcessor,
    RepetitionPenaltyProcessor,
    TemperatureProcessor,
    TopKProcessor,
    TopPProcessor,
    build_processors,
)
from pace_core.sampling.state import TokenState

V = 64


def assert_same_logits(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """Same -inf mask and (near-)equal finite entries."""
    assert torch.equal(torch.isneginf(ours), torch.isneginf(ref))
    fin = torch.isfinite(ref)
    torch.testing.assert_close(ours[fin], ref[fin], rtol=1e-6, atol=1e-6)


def make_batch(n_rows: int, seed: int = 0, n_generated: int = 5, scale: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, V, (3 + 2 * i,), generator=g) for i in range(n_rows)]
    state = TokenState(prompts, V)
    gens = [torch.randint(0, V, (n_rows,), generator=g) for _ in range(n_generated)]
    for t in gens:
        state.append(t)
    logits = torch.randn(n_rows, V, generator=g) * scale
    full_ids = [
        torch.cat([prompts[i], torch.stack([t[i] for t in gens])]) if gens else prompts[i]
        for i in range(n_rows)
    ]
    return logits, state, full_ids


def run(proc, logits, state):
    assert proc is not None
    return proc(logits.clone(), state)


def test_repetition_penalty_matches_hf_per_row():
    penalties = [1.3, 1.0, 0.7, 2.0]
    cfgs = [SamplingConfig(repetition_penalty=p) for p in penalties]
    logits, state, ids = make_batch(len(cfgs))
    out = run(RepetitionPenaltyProcessor.from_configs(cfgs), logits, state)
    for i, p in enumerate(penalties):
        if p == 1.0:
            assert torch.equal(out[i], logits[i])  # neutral row untouched, bit for bit
            continue
        ref = RepetitionPenaltyLogitsProcessor(p)(ids[i][None], logits[i : i + 1].clone())[0]
        assert torch.equal(out[i], ref)


def test_repetition_penalty_dense_view_agrees_and_prompt_only():
    cfgs = [SamplingConfig(repetition_penalty=1.5)] * 2
    logits, state, ids = make_batch(2, seed=3, n_generated=0)
    out = run(RepetitionPenaltyProcessor.from_configs(cfgs), logits, state)
    seen = state.seen_mask()
    expect = torch.where(seen, torch.where(logits < 0, logits * 1.5, logits / 1.5), logits)
    assert torch.equal(out, expect)
    ref = RepetitionPenaltyLogitsProcessor(1.5)(ids[1][None], logits[1:2].clone())[0]
    assert torch.equal(out[1], ref)


def test_temperature_matches_hf_and_skips_greedy_rows():
    cfgs = [
        SamplingConfig(do_sample=True, temperature=0.5),
        SamplingConfig(temperature=0.5),  # greedy: temperature not applied
        SamplingConfig(do_sample=True, temperature=1.7),
    ]
    logits, state, _ = make_batch(3)
    out = run(TemperatureProcessor.from_configs(cfgs), logits, state)
    assert torch.equal(out[0], TemperatureLogitsWarper(0.5)(None, logits[0:1].clone())[0])
    assert torch.equal(out[1], logits[1])
    assert torch.equal(out[2], TemperatureLogitsWarper(1.7)(None, logits[2:3].clone())[0])


def test_top_k_matches_hf_including_ties_and_k_above_vocab():
    ks = [1, 5, 0, 200]
    cfgs = [SamplingConfig(do_sample=True, top_k=k) for k in ks]
    logits, state, _ = make_batch(len(ks))
    logits[1, :10] = 20.0  # ten-way tie at the top, k=5: HF keeps all ties
    out = run(TopKProcessor.from_configs(cfgs), logits, state)
    for i, k in enumerate(ks):
        if k == 0:
            assert torch.equal(out[i], logits[i])
            continue
        ref = TopKLogitsWarper(k)(None, logits[i : i + 1].clone())[0]
        assert_same_logits(out[i], ref)
    assert int(torch.isfinite(out[1]).sum()) == 10


@pytest.mark.parametrize("scale", [0.3, 3.0])
def test_top_p_matches_hf(scale):
    ps = [0.1, 0.5, 0.9, 0.99, 1.0]
    cfgs = [SamplingConfig(do_sample=True, top_p=p) for p in ps]
    logits, state, _ = make_batch(len(ps), seed=7, scale=scale)
    out = run(TopPProcessor.from_configs(cfgs), logits, state)
    for i, p in enumerate(ps):
        if p == 1.0:
            assert torch.equal(out[i], logits[i])
            continue
        ref = TopPLogitsWarper(p)(None, logits[i : i + 1].clone())[0]
        assert_same_logits(out[i], ref)


def test_top_p_large_flat_vocab_grows_candidate_set():
    """Flat rows need more than the first 256 candidates; peaked rows do not."""
    v = 5000
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, v, generator=g) * torch.tensor([[0.05], [8.0], [0.5]])
    cfgs = [SamplingConfig(do_sample=True, top_p=p) for p in (0.9, 0.9, 0.6)]
    state = TokenState([[0]] * 3, v)
    out = run(TopPProcessor.from_configs(cfgs), logits, state)
    for i, cfg in enumerate(cfgs):
        ref = TopPLogitsWarper(cfg.top_p)(None, logits[i : i + 1].clone())[0]
        assert_same_logits(out[i], ref)
    assert int(torch.isfinite(out[0]).sum()) > 256


def test_min_p_matches_hf():
    ps = [0.05, 0.3, 0.0, 1.0]
    cfgs = [SamplingConfig(do_sample=True, min_p=p) for p in ps]
    logits, state, _ = make_batch(len(ps), seed=11)
    out = run(MinPProcessor.from_configs(cfgs), logits, state)
    for i, p in enumerate(ps):
        if p == 0.0:
            assert torch.equal(out[i], logits[i])
            continue
        ref = MinPLogitsWarper(p)(None, logits[i : i + 1].clone())[0]
        assert_same_logits(out[i], ref)


@pytest.mark.parametrize("n_generated", [0, 2, 3, 4])
def test_min_new_tokens_matches_hf(n_generated):
    cfgs = [
        SamplingConfig(min_new_tokens=3, eos_token_id=[1, 2]),
        SamplingConfig(min_new_tokens=0, eos_token_id=1),
        SamplingConfig(min_new_tokens=4, eos_token_id=5),
        SamplingConfig(min_new_tokens=4),  # EOS unknown: nothing to mask
    ]
    logits, state, ids = make_batch(len(cfgs), n_generated=n_generated)
    out = run(MinNewTokensProcessor.from_configs(cfgs), logits, state)
    for i, cfg in enumerate(cfgs[:3]):
        prompt_len = ids[i].numel() - n_generated
        hf = MinNewTokensLengthLogitsProcessor(prompt_len, cfg.min_new_tokens, cfg.eos_token_id)
        ref = hf(ids[i][None], logits[i : i + 1].clone())[0]
        assert torch.equal(out[i], ref)
    assert torch.equal(out[3], logits[3])


def test_logit_bias_matches_hf_sequence_bias():
    cfgs = [
        SamplingConfig(logit_bias={3: 2.5, 10: -100.0}),
        SamplingConfig(),
        SamplingConfig(logit_bias={3: -math.inf, 63: 0.5}),
    ]
    logits, state, ids = make_batch(3)
    out = run(LogitBiasProcessor.from_configs(cfgs), logits, state)
    for i, cfg in enumerate(cfgs):
        if not cfg.logit_bias:
            assert torch.equal(out[i], logits[i])
            continue
        bias = [[[t], float(b)] for t, b in cfg.logit_bias.items()]
        ref = SequenceBiasLogitsProcessor(bias)(ids[i][None], logits[i : i + 1].clone())[0]
        assert_same_logits(out[i], ref)
    assert out[2, 3] == -math.inf


def test_frequency_presence_penalty_hand_computed():
    v = 6
    state = TokenState([[4, 4, 5]], v)  # prompt tokens are not counted
    for t in (1, 2, 1, 1, 3):
        state.append(torch.tensor([t]))
    logits = torch.tensor([[1.0, 2.0, 3.0, -1.0, 0.5, 0.25]])
    cfg = SamplingConfig(frequency_penalty=0.5, presence_penalty=0.25)
    out = run(FrequencyPresencePenaltyProcessor.from_configs([cfg]), logits, state)
    # counts: token1 x3, token2 x1, token3 x1; x -= 0.5 * count + 0.25 * (count > 0)
    expect = torch.tensor([[1.0, 2.0 - 1.5 - 0.25, 3.0 - 0.5 - 0.25, -1.0 - 0.75, 0.5, 0.25]])
    torch.testing.assert_close(out, expect)
    # negative values reward repetition
    cfg = SamplingConfig(frequency_penalty=-1.0, presence_penalty=0.0)
    out = run(FrequencyPresencePenaltyProcessor.from_configs([cfg]), logits, state)
    torch.testing.assert_close(out[0, 1], torch.tensor(5.0))
    assert FrequencyPresencePenaltyProcessor.from_configs([SamplingConfig()]) is None


def test_frequency_presence_dense_view_agrees():
    cfgs = [
        SamplingConfig(frequency_penalty=0.3, presence_penalty=-0.2),
        SamplingConfig(),
        SamplingConfig(frequency_penalty=-1.1),
    ]
    logits, state, _ = make_batch(3, n_generated=30)  # many repeats in V=64
    out = run(FrequencyPresencePenaltyProcessor.from_configs(cfgs), logits, state)
    counts = state.output_counts().float()
    freq = torch.tensor([[0.3], [0.0], [-1.1]])
    pres = torch.tensor([[-0.2], [0.0], [0.0]])
    torch.testing.assert_close(out, logits - counts * freq - (counts > 0).float() * pres)
    assert torch.equal(out[1], logits[1])


def hf_chain(cfg: SamplingConfig, prompt_len: int) -> LogitsProcessorList:
    """The processors transformers' _get_logits_processor builds for ``cfg``, in its order."""
    procs = LogitsProcessorList()
    if cfg.logit_bias:
        procs.append(
            SequenceBiasLogitsProcessor([[[t], float(b)] for t, b in cfg.logit_bias.items()])
        )
    if cfg.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(cfg.repetition_penalty))
    if cfg.min_new_tokens > 0:
        procs.append(
            MinNewTokensLengthLogitsProcessor(prompt_len, cfg.min_new_tokens, cfg.eos_token_id)
        )
    if not cfg.is_greedy:
        if cfg.temperature != 1.0:
            procs.append(TemperatureLogitsWarper(cfg.temperature))
        if cfg.top_k:
            procs.append(TopKLogitsWarper(cfg.top_k))
        if cfg.top_p < 1.0:
            procs.append(TopPLogitsWarper(cfg.top_p))
        if cfg.min_p > 0:
            procs.append(MinPLogitsWarper(cfg.min_p))
    return procs


def test_full_chain_matches_hf_order():
    common = {"logit_bias": {7: 3.0, 8: -2.0}, "repetition_penalty": 1.4, "eos_token_id": 0}
    cfgs = [
        SamplingConfig(
            do_sample=True,
            temperature=0.7,
            top_k=20,
            top_p=0.8,
            min_p=0.05,
            min_new_tokens=10,
            **common,
        ),
        SamplingConfig(temperature=0.7, top_k=3, top_p=0.5, **common),  # greedy row
        SamplingConfig(do_sample=True, temperature=1.3, top_p=0.95, **common),
        SamplingConfig(do_sample=True),
    ]
    logits, state, ids = make_batch(len(cfgs), seed=5)
    out = logits.clone()
    for _, proc in build_processors(cfgs):
        out = proc(out, state)
    for i, cfg in enumerate(cfgs):
        prompt_len = ids[i].numel() - 5
        ref = hf_chain(cfg, prompt_len)(ids[i][None], logits[i : i + 1].clone())[0]
        assert_same_logits(out[i], ref)
    assert torch.equal(out[3], logits[3])


def test_builtin_order_and_none_when_unused():
    names = [n for n, _, _ in sorted(BUILTIN_PROCESSORS, key=lambda e: e[1])]
    assert names == [
        "logit_bias",
        "repetition_penalty",
        "frequency_presence_penalty",
        "min_new_tokens",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
    ]
    assert build_processors([SamplingConfig()] * 3) == []
    # warpers are not built for greedy rows
    assert build_processors([SamplingConfig(temperature=0.5, top_k=5, top_p=0.5, min_p=0.1)]) == []
    assert build_processors([]) == []


def test_custom_specs_and_registry_objects():
    class Spec:
        def __init__(self, name, factory, order):
            self.name, self.factory, self.order = name, factory, order

    calls = []

    def factory(cfgs):
        calls.append(len(cfgs))
        return lambda logits, state: logits + 1

    specs = [Spec("plus_one", factory, 50), ("temperature", 500, TemperatureProcessor.from_configs)]
    built = build_processors([SamplingConfig(do_sample=True, temperature=2.0)], specs)
    assert [n for n, _ in built] == ["plus_one", "temperature"]
    assert calls == [1]
