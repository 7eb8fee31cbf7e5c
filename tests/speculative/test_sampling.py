"""Rejection sampling preserves the target distribution (chi-square, fixed seeds)."""

from __future__ import annotations

import itertools

import pytest
import torch
from support.spec_models import prompts, save_llama

from pace_core import LLMModel, SamplingConfig
from pace_core.sampling.sampler import BatchSampler
from pace_core.speculative import (
    DraftSpecDecodeConfig,
    PardSpecDecodeConfig,
    PromptLookupConfig,
    verify_row,
)

P_MIN = 1e-3  # seeds are fixed, so each check is deterministic


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """p-value of Pearson's test; cells with small expectation are pooled into one."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    expected = probs / probs.sum() * counts.sum()
    small = expected < min_expected
    obs = torch.cat([counts[~small], counts[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = exp > 0
    assert bool((obs[~keep] == 0).all()), "a token with zero target probability was emitted"
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = obs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2.0))


def _dist(seed: int, v: int = 10, scale: float = 1.5) -> torch.Tensor:
    return torch.randn(v, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("sampled_q", [False, True])
def test_verify_row_emits_target_distribution(sampled_q):
    """First emitted token ~ p_0; given the first draft accepted, the second ~ p_1."""
    v, k, n = 10, 3, 6000
    logits = torch.stack([_dist(s, v) for s in range(k + 1)])
    p = torch.softmax(logits, dim=-1)
    q = torch.softmax(torch.stack([_dist(100 + s, v) for s in range(k)]), dim=-1)
    gen, draft_gen = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    if sampled_q:  # d_j ~ q_j, drawn up front
        drafts_all = torch.multinomial(q, n, replacement=True, generator=draft_gen).T.tolist()
    else:  # deterministic drafts, the first one not the argmax
        drafts_all = [[int(logits[0].topk(2).indices[1]), 2, 3]] * n
    first = torch.zeros(v)
    second = torch.zeros(v)
    for drafts in drafts_all:
        out, m = verify_row(logits, drafts, q if sampled_q else None, gen)
        assert len(out) == m + 1 and out[:m] == drafts[:m]
        first[out[0]] += 1
        if m >= 1:
            second[out[1]] += 1
    assert chi_square_p(first, p[0]) > P_MIN
    assert second.sum() > 300
    assert chi_square_p(second, p[1]) > P_MIN


def test_verify_row_greedy():
    logits = torch.stack([_dist(s) for s in range(4)])
    best = logits.argmax(dim=-1).tolist()
    assert verify_row(logits, best[:3], None, None) == (best, 3)
    wrong = (best[1] + 1) % 10
    assert verify_row(logits, [best[0], wrong, best[2]], None, None) == (best[:2], 1)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """12-token target, an independent draft, and the target's weights as a PARD draft
    (mask token 11): high acceptance, so later draft positions are verified often."""
    kw = dict(vocab=12, hidden=32, layers=1, noise=0.3)
    mk = tmp_path_factory.mktemp
    return {
        "target": save_llama(mk("spec_small_t"), seed=3, **kw),
        "draft": save_llama(mk("spec_small_d"), seed=4, **kw),
        "self_pard": save_llama(mk("spec_small_p"), seed=3, pard_token=11, **kw),
    }


@pytest.fixture(scope="module")
def small_plain(small):
    return LLMModel(small["target"], dtype=torch.float32, load_tokenizer=False)


def _exact_pairs(plain: LLMModel, prompt: list[int], cfg: SamplingConfig) -> torch.Tensor:
    """Exact P(t2, t3) = sum_t1 p(t1) p(t2 | t1) p(t3 | t1, t2) of the processed target."""
    v = plain.model.vocab_size

    def probs(generated: list[tuple[int, ...]]) -> torch.Tensor:
        logits = plain.logits(torch.tensor([[*prompt, *g] for g in generated]))[:, -1]
        sampler = BatchSampler([cfg] * len(generated), [prompt] * len(generated), v)
        for column in zip(*generated):  # the history as generated tokens (penalties)
            sampler.state.append(torch.tensor(column))
        return torch.softmax(sampler.process(logits), dim=-1)

    p1 = probs([()])[0]
    p2 = probs([(a,) for a in range(v)])  # [t1, t2]
    p3 = probs(list(itertools.product(range(v), range(v)))).view(v, v, v)  # [t1, t2, t3]
    return torch.einsum("a,ab,abc->bc", p1, p2, p3)


@pytest.mark.parametrize("method", ["draft", "self_draft", "self_pard", "prompt_lookup"])
def test_speculative_sampling_matches_target(method, small, small_plain):
    """Rows with their own seeds; (t2, t3) come from the first speculative round (draft
    positions 0 and 1). Position 1 must be processed with the provisional history (the
    presence penalty on t2): the test fails if it is not, or if the acceptance rule is off."""
    spec_cfg = {
        "draft": DraftSpecDecodeConfig(small["draft"], num_speculative_tokens=3),
        "self_draft": DraftSpecDecodeConfig(small["target"], num_speculative_tokens=3),
        "self_pard": PardSpecDecodeConfig(small["self_pard"], num_speculative_tokens=3),
        "prompt_lookup": PromptLookupConfig(num_speculative_tokens=3, max_ngram=1),
    }[method]
    spec = LLMModel(
        small["target"], dtype=torch.float32, load_tokenizer=False, spec_config=spec_cfg
    )
    prompt = [1, 4, 2, 7, 4, 9]
    base = SamplingConfig(
        max_new_tokens=4,
        do_sample=True,
        temperature=0.9,
        top_k=9,
        repetition_penalty=1.5,
        presence_penalty=2.0,
        ignore_eos=True,
    )
    n = 2000
    cfgs = [base.merged(seed=i) for i in range(n)]
    out = spec.generate(torch.tensor([prompt] * n), cfgs)
    tokens = torch.tensor(out.generated_token_ids)
    assert tokens.shape == (n, 4)
    if method != "prompt_lookup":
        assert out.spec_stats.num_draft_tokens >= 2 * n  # every row drafted 2 tokens
    v = small_plain.model.vocab_size
    counts = torch.bincount(tokens[:, 1] * v + tokens[:, 2], minlength=v * v).view(v, v)
    exact = _exact_pairs(small_plain, prompt, base)
    assert chi_square_p(counts, exact) > P_MIN


def test_seeded_sampling_reproducible_and_global_rng_untouched(small):
    spec = LLMModel(
        small["target"],
        dtype=torch.float32,
        load_tokenizer=False,
        spec_config=DraftSpecDecodeConfig(small["draft"], num_speculative_tokens=3),
    )
    cfg = SamplingConfig(max_new_tokens=20, do_sample=True, seed=7, ignore_eos=True)
    state = torch.get_rng_state()
    a = spec.generate(torch.tensor([[1, 2, 3]]), cfg).generated_token_ids
    assert torch.equal(state, torch.get_rng_state())
    b = spec.generate(torch.tensor([[1, 2, 3]]), cfg).generated_token_ids
    assert a == b
    c = spec.generate(torch.tensor([[1, 2, 3]]), cfg.merged(seed=8)).generated_token_ids
    assert a != c


def test_greedy_and_sampling_rows_in_one_batch(target_dir, draft_dir):
    plain = LLMModel(target_dir, dtype=torch.float32, load_tokenizer=False)
    spec = LLMModel(
        target_dir,
        dtype=torch.float32,
        load_tokenizer=False,
        spec_config=DraftSpecDecodeConfig(target_dir, num_speculative_tokens=3),
    )
    batch = prompts()[:4]
    greedy = SamplingConfig(max_new_tokens=12, ignore_eos=True)
    sample = SamplingConfig(max_new_tokens=12, do_sample=True, seed=3, ignore_eos=True)
    cfgs = [greedy, sample, greedy, sample]
    got = spec.generate(batch, cfgs).generated_token_ids
    want = plain.generate(batch, greedy).generated_token_ids
    assert got[0] == want[0] and got[2] == want[2]
    assert all(len(t) == 12 for t in got)
