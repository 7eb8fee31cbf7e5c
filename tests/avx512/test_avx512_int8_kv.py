"""pace-avx512 over int8 KV caches (``kv_cache_dtype="int8"``).

- The attention kernel over int8 block pools against the pace-native reference on the same
  pools (de-quantized, attended in fp32), random shapes: within one rounding of the output
  dtype, as tests/avx512/test_kernels.py's attention bound (``2^-8 |ref|`` in bf16, ``1e-4``
  in fp32, plus ``1e-5 max|v|``); and each of the kernel's int8 paths by name (decode rows
  de-quantized in registers, many rows through fp32 rows, prefill tiles over blocks prepared
  once: bf16 keys split into hi + lo so the tiles keep fp32 accuracy).
- The fused decoder stack quantizes K/V as it writes them through ``block_buffers()``: its
  logits and the int8 pools are bitwise those of the per-layer loop (which writes through the
  cache's ``update``), over mixed steps (prefill chunks, decodes, new prompts, a crop).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pace_avx512", reason="pip install --no-deps -e plugins/avx512")

from pace_avx512 import kernels
from pace_native import kernels as native
from support.tiny import FACTORIES

from pace_core import LLMModel
from pace_core.caches.kv_quant import pack_rows
from pace_core.models.decoder import forward_step

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)


def int8_view(k, v, mask, block_size: int, seed: int):
    """Int8 pools of ``k``/``v`` ``[B, Hk, S, D]`` in shuffled blocks (garbage elsewhere)."""
    b, hk, s, d = k.shape
    per_row = -(-s // block_size)
    gen = torch.Generator().manual_seed(seed)
    table = torch.randperm(b * per_row + 3, generator=gen)[: b * per_row].view(b, per_row)

    def pool(x):
        out = pack_rows(torch.randn(b * per_row + 3, hk, block_size, d, generator=gen))
        padded = torch.nn.functional.pad(x, (0, 0, 0, per_row * block_size - s))
        blocks = padded.view(b, hk, per_row, block_size, d).transpose(1, 2)
        out[table.reshape(-1)] = pack_rows(blocks.reshape(-1, hk, block_size, d))
        return out

    meta = SimpleNamespace(mask=lambda window: mask)
    return SimpleNamespace(key_pool=pool(k), value_pool=pool(v), block_table=table,
                           block_size=block_size, layout="paged", meta=meta)  # fmt: skip


@SETTINGS
@given(dtype=st.sampled_from([torch.float32, torch.bfloat16]), b=st.integers(1, 3),
       t=st.sampled_from([1, 2, 5, 16, 17, 40]), heads=st.sampled_from([(4, 2), (9, 3), (8, 1)]),
       s=st.one_of(st.integers(1, 300), st.integers(500, 700)),
       d=st.sampled_from([16, 24, 64, 80, 128, 256]), sinks=st.booleans(),
       block_size=st.sampled_from([16, 64, 256]))  # fmt: skip
def test_attention_over_int8_pools(ext, dtype, b, t, heads, s, d, sinks, block_size):
    check_int8_attention(dtype, b, t, heads, s, d, sinks, block_size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize(
    "t, heads",
    [
        (1, (9, 3)),  # decode, 3 rows per KV head: de-quantized in registers
        (5, (9, 3)),  # 15 rows: de-quantized once per block into fp32 rows
        (40, (9, 3)),  # prefill tiles: each block prepared once (bf16: [hi, lo] key rows)
        (17, (8, 1)),  # prefill tiles of 8 heads, a ragged last tile
    ],
)
def test_each_int8_attention_path(ext, dtype, d, t, heads):
    check_int8_attention(dtype, 2, t, heads, 650, d, True, 64)


def check_int8_attention(dtype, b, t, heads, s, d, sinks, block_size):
    """pace-avx512's attention over int8 pools against pace-native's, within one rounding."""
    hq, hk = heads
    gen = torch.Generator().manual_seed(s * 31 + d)
    q = torch.randn(b, t, hq, d, generator=gen).to(dtype).transpose(1, 2)
    k, v = (torch.randn(b, hk, s, d, generator=gen) for _ in range(2))
    lens = torch.tensor([s, max(1, s - 5), max(1, s // 2)])[:b]  # ragged rows, causal
    keys, qpos = torch.arange(s), lens[:, None] - t + torch.arange(t)
    mask = ((keys <= qpos[..., None]) & (keys < lens[:, None, None]))[:, None]
    mask[..., 0] = True
    sink = torch.randn(hq, generator=gen).to(dtype) if sinks else None
    view = int8_view(k, v, mask, block_size, seed=s)
    got = kernels.attention(q, view, d**-0.5, sink)
    ref = native.attention(q.float(), view, d**-0.5, None if sink is None else sink.float())
    assert got.shape == (b, hq, t, d) and got.dtype == dtype
    rel = 2.0**-8 if dtype == torch.bfloat16 else 1e-4
    bound = rel * ref.abs() + 1e-5 * v.abs().max()
    assert torch.all((got.float() - ref).abs() <= bound), (got.float() - ref).abs().max()


SCHEDULE = [  # (sequence, new tokens) per step; a crop of sequence 0 before step 3
    [(0, 7), (1, 3)],
    [(0, 1), (1, 5), (2, 9)],
    [(2, 1), (0, 1), (1, 2)],
    [(1, 1), (0, 4), (2, 1)],
    [(0, 1), (2, 1), (1, 1)],
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cache", ["paged", "slab_pool"])
@pytest.mark.parametrize("family", ["llama", "qwen2-sliding", "gemma3"])
def test_fused_stack_writes_int8_rows_like_the_python_loop(
    family, cache, dtype, tmp_path, ext, clean_env
):
    path = FACTORIES[family](tmp_path)
    models = [
        LLMModel(path, dtype=dtype, kv_cache_type=cache, kv_cache_dtype="int8",
                 load_tokenizer=False, opconfig={"default": "avx512", "decoder_stack": stack})
        for stack in ("avx512", "native")
    ]  # fmt: skip
    fused = models[0]
    assert fused.op_plan.backends()["decoder_stack"] == {"avx512"}
    assert models[1].op_plan.backends()["attention"] == {"avx512"}
    calls = []
    run = fused.model.stack.weight.cpp.run
    object.__setattr__(
        fused.model.stack.weight, "cpp",
        SimpleNamespace(run=lambda *a, **kw: calls.append(1) or run(*a, **kw)),
    )  # fmt: skip
    caches = [m.new_cache(block_size=4) for m in models]
    seqs = [c.add_sequences(3) for c in caches]
    for step, rows in enumerate(SCHEDULE):
        if step == 3:
            for c, ids in zip(caches, seqs):
                c.crop(ids[0], 3)
        width = max(n for _, n in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        for b, (seq, n) in enumerate(rows):
            gen = torch.Generator().manual_seed(10 * step + seq)
            ids[b, width - n :] = torch.randint(3, 60, (n,), generator=gen)
        counts = [n for _, n in rows]
        logits = [
            forward_step(m.model, c, [s[seq] for seq, _ in rows], ids, counts, all_logits=True)
            for m, c, s in zip(models, caches, seqs)
        ]
        for b, n in enumerate(counts):
            assert torch.equal(logits[0][b, width - n :], logits[1][b, width - n :]), (step, b)
    assert len(calls) == len(SCHEDULE)
    for got, want in zip(caches[0].keys + caches[0].values, caches[1].keys + caches[1].values):
        assert got.dtype == torch.int8 and torch.equal(got, want)
