"""Per-op profiling counts every kernel call when enabled and costs nothing when not."""

from __future__ import annotations

import torch

from pace_core import LLMModel, SamplingConfig


def test_profile_counts_calls_per_op(tiny_llama_dir):
    model = LLMModel(tiny_llama_dir, dtype=torch.float32, load_tokenizer=False, profile=True)
    model.generate(torch.tensor([[1, 2, 3]]), SamplingConfig(max_new_tokens=4, ignore_eos=True))
    calls = {op: n for (op, _), n in model.profiler.calls.items()}
    # 4 forwards (prefill + 3 decodes) x 2 layers
    assert calls["attention"] == 8 and calls["qkv_proj"] == 8 and calls["gated_mlp"] == 8
    assert calls["rms_norm"] == 4 * (2 * 2 + 1)
    assert "decoder_stack" not in calls  # it contains the others: timing it would count twice
    stack = [site for site in model.op_plan.sites if site[0] == "decoder_stack"]
    assert [backend for _, backend, _ in stack] == ["native"]  # the per-layer path is profiled
    report = model.profiler.report(wall_seconds=10.0)
    assert "attention" in report and "(outside kernels)" in report


def test_no_profiler_by_default(tiny_llama_dir, monkeypatch):
    monkeypatch.delenv("PACE_PROFILE", raising=False)
    model = LLMModel(
        tiny_llama_dir, dtype=torch.float32, load_tokenizer=False, opconfig="default=native"
    )
    assert model.profiler is None
    from pace_native import kernels

    assert model.model.layers[0].attn.attend is kernels.attention
