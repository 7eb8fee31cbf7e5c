"""The ``avx2`` build target: the same kernels with each 512-bit intrinsic on two 256-bit
registers (csrc/avx512_on_avx2.h). On an AVX2-only CPU the whole suite runs it; this test
builds and runs it on AVX-512 CPUs too (in a process told its CPU lacks AVX-512), so the
emulation is checked wherever the suite runs.

Bounds: fp32 greedy tokens equal to native and logits within 1e-4; int8 and int4 weights
(``vpdpbusd`` in its AVX2 forms: signed bytes, nibbles summed in int16; activations as 15-bit
integers) greedy tokens equal and logits within 2e-2 of native. On an AVX-512 CPU the avx2
build's logits are also within 1e-4 of the native AVX-512 build's: the same arithmetic (the
same integer sums), the reductions' order aside."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

SCRIPT = r"""
import sys, torch
from pace_avx512 import build
from pace_core import LLMModel, SamplingConfig

odd, tiny, out = sys.argv[1:]  # sizes off the block multiples (fp32); multiples of 32 (int8/4)
ops = ("linear", "qkv_proj", "gated_mlp", "rms_norm", "rope", "attention", "decoder_stack")
avx = {**dict.fromkeys(ops, "avx512"), "default": "native", "strict": True}
ids = torch.randint(3, 60, (2, 12), generator=torch.Generator().manual_seed(1))
result = {"target": build.target()}
for name, path, quant in (("fp32", odd, None), ("int8", tiny, "int8"), ("int4", tiny, "int4")):
    for plan, cfg in (("avx512", avx), ("native", {"default": "native"})):
        llm = LLMModel(path, dtype=torch.float32, opconfig=cfg, quantization=quant,
                       load_tokenizer=False, quiet=True)
        s = SamplingConfig(max_new_tokens=8, ignore_eos=True)
        result[name, plan] = (llm.generate(ids, s).generated_token_ids, llm.logits(ids))
torch.save(result, out)
"""
NO_AVX512 = "avx512f,avx512bw,avx512vl,avx512_bf16,avx512_vnni"

pytestmark = pytest.mark.slow  # builds the avx2 target (~2 min on 2 cores) where not cached


def run(odd, tiny, out, disable: str | None) -> dict:
    env = {**os.environ, "PACE_DISABLE_PLUGINS": "onednn,tpp"}
    env.pop("PACE_CPU_FEATURES", None)
    env.pop("PACE_CPU_FEATURES_DISABLE", None)
    if disable:
        env["PACE_CPU_FEATURES_DISABLE"] = disable
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(odd), str(tiny), str(out)],
                          env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return torch.load(out)


def test_the_avx2_build_matches_native(odd_llama_dir, tiny_llama_dir, tmp_path):
    from pace_avx512 import build

    from pace_core.cpu import detect_cpu

    if not detect_cpu().has(*build.AVX2_FEATURES):
        pytest.skip("this CPU has no AVX2")
    emulated = run(odd_llama_dir, tiny_llama_dir, tmp_path / "avx2.pt", NO_AVX512)
    assert emulated["target"] == "avx2"
    for name, bound in (("fp32", 1e-4), ("int8", 2e-2), ("int4", 2e-2)):
        tokens, logits = emulated[name, "avx512"]
        ref_tokens, ref_logits = emulated[name, "native"]
        assert tokens == ref_tokens, name
        assert float((logits - ref_logits).abs().max()) <= bound, name
    if detect_cpu().has(*build.BASE_FEATURES, "avx512_vnni"):
        real = run(odd_llama_dir, tiny_llama_dir, tmp_path / "avx512.pt", None)
        assert real["target"] != "avx2"
        for name in ("fp32", "int8", "int4"):
            diff = (emulated[name, "avx512"][1] - real[name, "avx512"][1]).abs().max()
            assert float(diff) <= 1e-4, name
