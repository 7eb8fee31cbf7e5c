"""Architectures with no pace family load through transformers' own code compiled with the
pace backend, attending over pace's caches: same greedy tokens and logits as transformers
(fp32), through the engine core (continuous batching over the paged cache)."""

from __future__ import annotations

import logging

import pytest
import torch
from support.no_family import fresh_dynamo, no_family_model  # noqa: F401 (a fixture)

from pace_core import LLMModel
from pace_core.errors import ModelLoadError
from pace_core.sampling.config import SamplingConfig

ARCHS = {  # model_type -> extra config (pace has a family for none of them)
    "olmo2": {"num_key_value_heads": 2},
    "gpt_neox": {"rotary_pct": 0.5},
}
PROMPTS = [[5, 17, 42, 9, 101, 7, 3], [250, 4], [60, 61, 62, 63, 64]]


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def save_tiny(arch: str, path, **overrides) -> torch.nn.Module:
    model = no_family_model(arch, **{**ARCHS.get(arch, {}), **overrides})
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize(
    ("arch", "kv_cache_type"), [("olmo2", "paged"), ("gpt_neox", "paged"), ("olmo2", "dynamic")]
)
def test_matches_transformers(arch, kv_cache_type, tmp_path, caplog):
    reference = save_tiny(arch, tmp_path)
    with caplog.at_level(logging.WARNING, logger="pace.models"):
        llm = LLMModel(
            tmp_path, dtype=torch.float32, load_tokenizer=False, kv_cache_type=kv_cache_type
        )
    assert f"model_type '{arch}' has no pace family" in caplog.text
    compiled_at_load = set(llm.op_plan.backends())
    assert {"attention", "linear", "embedding"} <= compiled_at_load, str(llm.op_plan)
    out = llm.generate(
        [torch.tensor(p) for p in PROMPTS], SamplingConfig(max_new_tokens=12), output_logits=True
    )
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            ids = torch.tensor([prompt])
            want = reference.generate(ids, max_new_tokens=12, do_sample=False)[0, len(prompt) :]
            assert out.generated_token_ids[i] == want.tolist(), (arch, i)
            full = torch.cat([ids, want[None, :-1]], dim=1)
            want_logits = reference(full).logits[0, len(prompt) - 1 :]
            torch.testing.assert_close(out.logits[i], want_logits, rtol=1e-4, atol=1e-4)
    plan = llm.op_plan.backends()
    assert {"attention", "linear", "embedding"} <= set(plan), str(llm.op_plan)
    assert ("rms_norm" if arch == "olmo2" else "layer_norm") in plan


def test_what_the_fallback_cannot_do_is_a_clear_error(tmp_path):
    save_tiny("olmo2", tmp_path / "olmo2")
    with pytest.raises(ModelLoadError, match="no pace family.*quantization"):
        LLMModel(tmp_path / "olmo2", load_tokenizer=False, quantization="int8")
    save_tiny("gemma2", tmp_path / "gemma2", num_key_value_heads=2, head_dim=16)
    with pytest.raises(ModelLoadError, match="soft-capping"):
        LLMModel(tmp_path / "gemma2", load_tokenizer=False)
