"""The scheduler's prefill budget: whole chunks when alone, a time slice while decoding."""

from __future__ import annotations

import pytest

from pace_core.engine.config import EngineConfig
from pace_core.engine.prefill_budget import PrefillBudget
from pace_core.errors import ConfigError


def test_full_budget_until_a_rate_is_measured_or_when_nothing_decodes():
    budget = PrefillBudget(max_tokens=512, slice_ms=50)
    assert budget.tokens(decoding=True) == 512  # no rate yet
    budget.record(tokens=1000, seconds=1.0)
    assert budget.rate == 1000
    assert budget.tokens(decoding=False) == 512
    assert budget.tokens(decoding=True) == 50  # 50 ms at 1000 tok/s


def test_slice_is_clamped_and_the_rate_is_averaged():
    budget = PrefillBudget(max_tokens=512, slice_ms=50, min_tokens=16)
    budget.record(100, 1.0)  # 100 tok/s: 5 tokens per slice -> the minimum
    assert budget.tokens(decoding=True) == 16
    budget.record(100_000, 1.0)  # averaged, not replaced: 0.7 * 100 + 0.3 * 100000
    assert budget.rate == pytest.approx(30_070)
    assert budget.tokens(decoding=True) == 512  # capped at max_tokens
    budget.record(0, 1.0)
    budget.record(10, 0.0)  # empty or instantaneous forwards are ignored
    assert budget.rate == pytest.approx(30_070)


def test_the_rate_is_the_marginal_one_of_prefill_only_forwards():
    """A mixed forward's average rate counts its fixed part (weights, LM head) against a few
    prompt tokens; a budget from it would keep chunks small. Only prefill-only forwards of
    ``rate_min_tokens`` and more measure the rate; the mixed average stands in until then."""
    budget = PrefillBudget(max_tokens=512, slice_ms=50, rate_min_tokens=64)
    budget.record(tokens=16, seconds=0.05, decodes=8)  # 24 tokens of step work in 50 ms
    assert budget.rate is None and budget.mixed_rate == pytest.approx(480)
    assert budget.tokens(decoding=True) == 24  # the stand-in: 50 ms at 480 tok/s
    budget.record(tokens=32, seconds=0.05)  # prefill alone, too short to amortize the fixed part
    assert budget.rate is None
    budget.record(tokens=128, seconds=0.128)  # 1000 tok/s
    assert budget.rate == pytest.approx(1000)
    budget.record(tokens=16, seconds=0.1, decodes=30)  # later mixed forwards leave it alone
    assert budget.rate == pytest.approx(1000)
    assert budget.tokens(decoding=True) == 50
    assert PrefillBudget(max_tokens=8, slice_ms=50).rate_min_tokens == 8


def test_slicing_off_and_bad_values():
    off = PrefillBudget(max_tokens=64, slice_ms=0)
    off.record(10, 1.0)
    assert off.tokens(decoding=True) == 64
    assert PrefillBudget(max_tokens=8, slice_ms=50).min_tokens == 8
    with pytest.raises(ConfigError, match="prefill_slice_ms must be >= 0"):
        EngineConfig(prefill_slice_ms=-1)
    with pytest.raises(ConfigError, match="max_prefill_tokens must be >= 1"):
        PrefillBudget(max_tokens=0, slice_ms=50)
