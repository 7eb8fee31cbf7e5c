"""The avx512 kernels run without the GIL: while one thread is inside a kernel, another
thread's Python keeps running (a serving engine's forward must not stall the HTTP thread,
nor queue its own Python behind the HTTP thread's backlog)."""

from __future__ import annotations

import pytest
import torch
from support.gil import assert_runs_without_gil

pytest.importorskip("pace_avx512", reason="pip install --no-deps -e plugins/avx512")

from pace_avx512 import kernels, packing

from pace_core.engine.llm import LLMModel
from pace_core.models.decoder import forward_step


def test_linear_and_attention_release_the_gil():
    w = packing.prepare_linear((torch.randn(8192, 1024) * 0.05).bfloat16())
    x = torch.randn(1024, 1024).bfloat16()
    assert_runs_without_gil(lambda: kernels.linear(x, w))
    q = torch.randn(8, 8, 256, 64).bfloat16()
    k = torch.randn(8, 2, 2048, 64).bfloat16()
    v = torch.randn(8, 2, 2048, 64).bfloat16()
    mask = torch.ones(8, 1, 256, 2048, dtype=torch.bool)
    ext = kernels._ext()
    assert_runs_without_gil(lambda: ext.attention(q, k, v, mask, 0.125, None))


def test_the_fused_decoder_stack_releases_the_gil(smollm2_dir):
    llm = LLMModel(smollm2_dir, dtype=torch.bfloat16, kv_cache_type="paged", quiet=True,
                   opconfig={"default": "avx512"}, load_tokenizer=False)  # fmt: skip
    assert llm.op_plan.backends()["decoder_stack"] == {"avx512"}
    ids = torch.randint(100, 10000, (1, 128))
    cache = llm.new_cache()
    seq = cache.add_sequences(1)

    def prefill() -> None:
        with torch.inference_mode():
            forward_step(llm.model, cache, seq, ids, [ids.shape[1]])

    assert_runs_without_gil(prefill)
