"""Real checkpoints on the avx512 plan (fused decoder stack included) against the native plan:
SmolLM2-135M by default, Gemma-3-270M under ``slow``. fp32: identical greedy tokens and logits
within 1e-3; bf16: every greedy token is a near-tie choice under the fp32 native logits."""

from __future__ import annotations

import pytest
import torch
from support.parity import topk_rule_ok

from pace_core import LLMModel, SamplingConfig

pytest.importorskip("pace_avx512", reason="pip install --no-deps -e plugins/avx512")

PROMPTS = ["Once upon a time, there was a little", "def fibonacci(n):"]
AVX512 = {"default": "avx512", "decoder_stack": "avx512"}
NATIVE = {"default": "native"}


def compare(path, n: int) -> None:
    ours = LLMModel(path, dtype=torch.float32, opconfig=AVX512)
    ref = LLMModel(path, dtype=torch.float32, opconfig=NATIVE)
    assert ours.op_plan.backends()["decoder_stack"] == {"avx512"}
    sampling = SamplingConfig(max_new_tokens=n, ignore_eos=True)
    for prompt in PROMPTS:
        got = ours.generate(prompt, sampling, output_logits=True)
        want = ref.generate(prompt, sampling, output_logits=True)
        assert got.sequences[0].token_ids == want.sequences[0].token_ids, prompt
        assert (got.logits[0] - want.logits[0]).abs().max() < 1e-3
    bf16 = LLMModel(path, dtype=torch.bfloat16, opconfig=AVX512)
    for prompt in PROMPTS:
        out = bf16.generate(prompt, sampling).sequences[0]
        ids = torch.tensor([out.prompt_token_ids + out.token_ids])
        exact = ref.logits(ids)[0]
        start = len(out.prompt_token_ids) - 1
        for t, token in enumerate(out.token_ids):
            assert topk_rule_ok(exact[start + t], token), (prompt, t, token)


def test_smollm2_avx512_equals_native(smollm2_dir):
    compare(smollm2_dir, 32)


@pytest.mark.slow
def test_gemma3_avx512_equals_native(gemma3_dir):
    compare(gemma3_dir, 32)
