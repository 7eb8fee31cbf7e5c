"""The fused decoder stack over the block caches (paged, slab_pool): the C++ step writes K/V
into the pool blocks through the block table (``block_buffers()``) and attends over it.

Against the per-layer Python loop on the same kernels (which writes through ``update()``):
bitwise equal logits and pools, with the C++ path taken at every step, for ragged
left-padded batches through prefill and decode, and for mixed steps (prefill chunks, decodes
and new prompts together, rows in any order, a speculative crop in between). On SmolLM2:
greedy tokens equal the contiguous cache's.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("pace_avx512", reason="pip install --no-deps -e plugins/avx512")

from support.tiny import FACTORIES

from pace_core import LLMModel, SamplingConfig
from pace_core.models.decoder import forward_step

BLOCK_CACHES = ("paged", "slab_pool")
FUSED = ("llama", "llama-llama3", "qwen2-sliding", "qwen3-sliding", "smollm3-nope",
         "phi3-partial-sliding", "gemma3")  # fmt: skip
DTYPES = (torch.float32, torch.bfloat16)
NEW_TOKENS = 12


def load(path, dtype, stack: str, cache: str) -> LLMModel:
    return LLMModel(path, dtype=dtype, opconfig={"default": "avx512", "decoder_stack": stack},
                    kv_cache_type=cache, load_tokenizer=False)  # fmt: skip


def spy(model: LLMModel) -> list[tuple]:
    """Record each C++ call's block table argument (the stack's ``run``), every position
    through the last layer (its last-token-only prefill: tests/avx512/test_model.py)."""
    calls: list[tuple] = []
    stack = model.model.stack.weight
    run = stack.cpp.run

    def recording(*args, **kwargs):
        calls.append(args[9:])  # (block_table, block_size)
        return run(*args, **{**kwargs, "last_only": False})

    object.__setattr__(stack, "cpp", SimpleNamespace(run=recording))
    return calls


def tokens(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 60, (n,), generator=gen)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cache", BLOCK_CACHES)
@pytest.mark.parametrize("family", FUSED)
def test_fused_stack_over_block_caches_equals_the_python_loop(
    family, cache, dtype, tmp_path, ext, clean_env
):
    path = FACTORIES[family](tmp_path)
    fused, loop = load(path, dtype, "avx512", cache), load(path, dtype, "native", cache)
    assert fused.op_plan.backends()["decoder_stack"] == {"avx512"}
    ids = torch.zeros(3, 14, dtype=torch.long)
    mask = torch.zeros(3, 14, dtype=torch.long)
    for i, n in enumerate((14, 9, 3)):
        ids[i, 14 - n :], mask[i, 14 - n :] = tokens(n, seed=i), 1
    batch = {"input_ids": ids, "attention_mask": mask}
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    calls = spy(fused)
    got = fused.generate(batch, sampling, output_logits=True)
    want = loop.generate(batch, sampling, output_logits=True)
    assert len(calls) == NEW_TOKENS  # prefill + every decode step went through C++ ...
    assert all(table is not None and size > 0 for table, size in calls)  # ... over the pools
    assert got.generated_token_ids == want.generated_token_ids
    for row in range(3):
        assert torch.equal(got.logits[row], want.logits[row])


# (sequence, new tokens) per step: prefill, then chunks + decodes + a new prompt together,
# rows out of order, a row that sits a step out, and a crop (speculative rollback) before 4.
SCHEDULE = [
    [(0, 7), (1, 3)],
    [(0, 1), (1, 5), (2, 9)],
    [(2, 1), (0, 1), (1, 2)],
    [(1, 1), (0, 4), (2, 1)],
    [(0, 1), (2, 1), (1, 1)],
]
CROP_BEFORE = {3: (0, 3)}  # step -> (sequence, tokens dropped)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cache", BLOCK_CACHES)
@pytest.mark.parametrize("family", ["llama", "qwen2-sliding", "gemma3"])
def test_mixed_steps_over_block_caches_equal_the_python_loop(
    family, cache, dtype, tmp_path, ext, clean_env
):
    """Rows with different numbers of new tokens in one step (packed by the C++ stack, no
    padding computed), 4-token blocks (tokens cross blocks within a step): every step's
    logits at every real position and the final K/V of every sequence are bitwise the
    loop's."""
    path = FACTORIES[family](tmp_path)
    fused, loop = load(path, dtype, "avx512", cache), load(path, dtype, "native", cache)
    calls = spy(fused)
    caches = [m.new_cache(block_size=4) for m in (fused, loop)]
    seqs = [c.add_sequences(3) for c in caches]
    for step, rows in enumerate(SCHEDULE):
        if step in CROP_BEFORE:
            seq, n = CROP_BEFORE[step]
            for c, ids in zip(caches, seqs):
                c.crop(ids[seq], n)
        width = max(n for _, n in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        for b, (seq, n) in enumerate(rows):
            ids[b, width - n :] = tokens(n, seed=10 * step + seq)
        counts = [n for _, n in rows]
        logits = [
            forward_step(m.model, c, [s[seq] for seq, _ in rows], ids, counts, all_logits=True)
            for m, c, s in zip((fused, loop), caches, seqs)
        ]
        for b, n in enumerate(counts):  # real positions (the stack returns padding as 0)
            assert torch.equal(logits[0][b, width - n :], logits[1][b, width - n :]), (step, b)
        assert len(calls) == step + 1 and calls[-1][1] == 4
    for seq in range(3):
        got, want = (c.get_kv_states(s[seq]) for c, s in zip(caches, seqs))
        assert caches[0].get_num_tokens(seqs[0][seq]) == caches[1].get_num_tokens(seqs[1][seq])
        for (k, v), (wk, wv) in zip(got, want):
            assert torch.equal(k, wk) and torch.equal(v, wv)


def test_smollm2_block_caches_give_the_contiguous_tokens(smollm2_dir, ext, clean_env):
    """Real checkpoint, bf16, fused stack on every cache: greedy tokens of a ragged batch
    through paged and slab_pool equal dynamic's."""
    sampling = SamplingConfig(max_new_tokens=16, ignore_eos=True)
    prompts = ["Once upon a time, there was a little", "def fibonacci(n):"]
    results = {}
    for cache in ("dynamic", *BLOCK_CACHES):
        model = LLMModel(smollm2_dir, dtype=torch.bfloat16, kv_cache_type=cache,
                         opconfig={"default": "avx512", "decoder_stack": "avx512"})  # fmt: skip
        assert model.op_plan.backends()["decoder_stack"] == {"avx512"}
        calls = spy(model)
        results[cache] = [model.generate(prompts, sampling).generated_token_ids]
        results[cache] += [model.generate(p, sampling).generated_token_ids for p in prompts]
        assert len(calls) == 3 * 16
    assert results["paged"] == results["dynamic"]
    assert results["slab_pool"] == results["dynamic"]
