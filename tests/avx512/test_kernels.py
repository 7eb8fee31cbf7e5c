"""Every pace-avx512 kernel against the pace-native reference, over randomized shapes.

Tolerances (elementwise, ``ref`` computed by pace-native in fp32 from the same inputs):

- fp32: ``|got - ref| <= 1e-4 * |ref| + 1e-5 * scale``, where ``scale = |x| @ |W|^T`` bounds
  the reordering error of fp32 accumulation (it matters only under cancellation).
- bf16 (fp32 accumulation, one rounding to bf16 at the end): ``|got - ref| <= 2^-8 * |ref|
  + 1e-5 * scale``, one bf16 ulp. The gated MLP also rounds its intermediate ``h`` to bf16
  (as native does), which adds ``2^-8 * (|h| @ |down|^T)``.
- RMSNorm: the residual sum is exact (same rounding as torch); ``y`` within 1e-5 relative
  (fp32) or one bf16 ulp (<= 2^-7 relative) of native's own output.
- rope and attention: 1e-4 (fp32) or 2^-8 (bf16) relative to native in fp32 from the same
  inputs (fp32 math, one rounding); attention also ``1e-5 * max|v|`` absolute.
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pace_avx512", reason="pip install --no-deps -e plugins/avx512")

from pace_avx512 import build, kernels, packing
from pace_native import kernels as native

from pace_core import ops
from pace_core.jit import BuildFailed

# bf16 matmuls need AVX512-BF16 (vdpbf16ps); the other kernels widen bf16 and run anywhere
MATMUL = (torch.float32, torch.bfloat16)
MATMUL_DTYPES = st.sampled_from(MATMUL)
DTYPES = st.sampled_from([torch.float32, torch.bfloat16])
ROWS = st.one_of(st.integers(1, 20), st.integers(64, 200))  # decode GEMV and prefill GEMM
DIMS = st.one_of(st.integers(1, 80), st.integers(81, 300))  # incl. non-multiples of 16/32
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)


def tensor(seed: int, *shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def rows_of(x2d: torch.Tensor, lead: int) -> torch.Tensor:
    """Give the activations a leading batch dim when it divides M (the kernels flatten it)."""
    m = x2d.shape[0]
    return x2d.view(lead, m // lead, -1) if m % lead == 0 else x2d


def assert_within(got: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> None:
    err = (got.float() - ref).abs()
    worst = (err - bound).max()
    assert worst <= 0, f"max error {float(err.max()):.3g} exceeds the bound by {float(worst):.3g}"


def rel(dtype: torch.dtype) -> float:
    return 1e-4 if dtype == torch.float32 else 2.0**-8


@SETTINGS
@given(dtype=MATMUL_DTYPES, m=ROWS, k=DIMS, n=DIMS, bias=st.booleans(),
       lead=st.sampled_from([1, 2]))  # fmt: skip
def test_linear(ext, dtype, m, k, n, bias, lead):
    x = rows_of(tensor(1, m, k, dtype=dtype), lead)
    w = tensor(2, n, k, dtype=dtype, scale=k**-0.5)
    b = tensor(3, n, dtype=dtype) if bias else None
    got = kernels.linear(x, packing.prepare_linear(w, b))
    assert got.dtype == dtype and got.shape == (*x.shape[:-1], n)
    ref = native.linear(
        x.float(), native.prepare_linear(w.float(), None if b is None else b.float())
    )
    scale = x.float().abs() @ w.float().abs().T
    assert_within(got, ref, rel(dtype) * ref.abs() + 1e-5 * scale)


@SETTINGS
@given(dtype=MATMUL_DTYPES, m=ROWS, k=DIMS, sizes=st.tuples(DIMS, DIMS, DIMS), bias=st.booleans())
def test_qkv_proj(ext, dtype, m, k, sizes, bias):
    x = tensor(1, 1, m, k, dtype=dtype)
    ws = [tensor(10 + i, s, k, dtype=dtype, scale=k**-0.5) for i, s in enumerate(sizes)]
    bs = [tensor(20 + i, s, dtype=dtype) for i, s in enumerate(sizes)] if bias else None
    got = kernels.qkv_proj(x, packing.prepare_qkv(ws, bs))
    ref = native.qkv_proj(x.float(), native.prepare_qkv(
        [w.float() for w in ws], None if bs is None else [b.float() for b in bs]))  # fmt: skip
    for g, r, w in zip(got, ref, ws):
        assert g.shape == r.shape and g.dtype == dtype
        assert_within(g, r, rel(dtype) * r.abs() + 1e-5 * (x.float().abs() @ w.float().abs().T))


@SETTINGS
@given(dtype=MATMUL_DTYPES, m=ROWS, hidden=DIMS, inter=DIMS,
       act=st.sampled_from(sorted(packing.ACTIVATIONS)))  # fmt: skip
def test_gated_mlp(ext, dtype, m, hidden, inter, act):
    x = tensor(1, m, hidden, dtype=dtype)
    gate = tensor(2, inter, hidden, dtype=dtype, scale=hidden**-0.5)
    up = tensor(3, inter, hidden, dtype=dtype, scale=hidden**-0.5)
    down = tensor(4, hidden, inter, dtype=dtype, scale=inter**-0.5)
    got = kernels.gated_mlp(x, packing.prepare_gated_mlp(gate, up, down, act))
    assert got.shape == x.shape and got.dtype == dtype
    gf, uf, df, xf = gate.float(), up.float(), down.float(), x.float()
    ref = native.gated_mlp(xf, native.prepare_gated_mlp(gf, uf, df, act))
    h = native.ACTIVATIONS[act](xf @ gf.T) * (xf @ uf.T)
    # relative to the magnitude of the terms of the down projection; also covers the
    # activations' exp/erf approximations (~1e-7) and fp32 accumulation order
    assert_within(got, ref, rel(dtype) * (ref.abs() + h.abs() @ df.abs().T) + 1e-6)


@SETTINGS
@given(dtype=DTYPES, rows=st.one_of(st.integers(1, 8), st.integers(100, 300)),
       h=DIMS, residual=st.booleans(), eps=st.sampled_from([1e-6, 1e-5, 0.1]))  # fmt: skip
def test_rms_norm(ext, dtype, rows, h, residual, eps):
    x = tensor(1, 1, rows, h, dtype=dtype)
    res = tensor(2, 1, rows, h, dtype=dtype) if residual else None
    w = tensor(3, h, dtype=torch.float32)
    y, s = kernels.rms_norm(x, w, eps, res)
    y_ref, s_ref = native.rms_norm(x, w, eps, res)
    assert y.dtype == dtype and s.dtype == dtype and y.shape == x.shape
    if res is None:
        assert s is x  # native returns its input as the new residual
    torch.testing.assert_close(s, s_ref, rtol=0, atol=0)
    ulp = 1e-5 if dtype == torch.float32 else 2.0**-7
    assert_within(y, y_ref.float(), ulp * y_ref.float().abs() + 1e-6)


@SETTINGS
@given(dtype=DTYPES, rows=st.one_of(st.integers(1, 8), st.integers(100, 300)), h=DIMS,
       residual=st.booleans(), bias=st.booleans(), eps=st.sampled_from([1e-5, 0.1]),
       offset=st.sampled_from([0.0, 30.0]))  # fmt: skip
def test_layer_norm(ext, dtype, rows, h, residual, bias, eps, offset):
    """``offset`` shifts the rows far from zero: the variance must not cancel."""
    x = tensor(1, 1, rows, h, dtype=torch.float32).add(offset).to(dtype)
    res = tensor(2, 1, rows, h, dtype=dtype) if residual else None
    w, b = tensor(3, h, dtype=dtype), (tensor(4, h, dtype=dtype) if bias else None)
    y, s = kernels.layer_norm(x, w, b, eps, res)
    y_ref, s_ref = native.layer_norm(x, w, b, eps, res)
    assert y.dtype == dtype and s.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(s, s_ref, rtol=0, atol=0)
    ulp = 1e-4 if dtype == torch.float32 else 2.0**-7
    assert_within(y, y_ref.float(), ulp * (y_ref.float().abs() + w.float().abs()) + 1e-5)


@SETTINGS
@given(dtype=DTYPES, b=st.integers(1, 3), t=st.integers(1, 20), heads=st.sampled_from(
       [(4, 2), (9, 3), (2, 2)]), d=st.sampled_from([8, 16, 24, 64, 80]),
       part=st.sampled_from([1.0, 0.5]), interleaved=st.booleans())  # fmt: skip
def test_rope_in_place(ext, dtype, b, t, heads, d, part, interleaved):
    hq, hk = heads
    qkv = tensor(1, b, t, (hq + 2 * hk) * d, dtype=dtype)  # q and k are strided views of it
    q = qkv[..., : hq * d].view(b, t, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, t, hk, d)
    r = int(d * part) // 2 * 2
    angles = tensor(2, b, t, r // 2, dtype=torch.float32)
    emb = angles.repeat_interleave(2, -1) if interleaved else torch.cat([angles, angles], -1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    ref = native.rope(q.float(), k.float(), cos.float(), sin.float(), interleaved)
    q0, k0 = q.clone(), k.clone()
    got = kernels.rope(q, k, cos, sin, interleaved)
    assert got[0].data_ptr() == q.data_ptr() and got[1].data_ptr() == k.data_ptr()  # in place
    for g, rf, before in zip(got, ref, (q0, k0)):
        assert_within(g, rf, rel(dtype) * rf.abs() + 1e-6)
        assert torch.equal(g[..., r:], before[..., r:])  # dims past R pass through


def cache_view(k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, layout: str, seed: int):
    """A cache view of ``k``/``v`` ``[B, Hk, S, D]`` in ``layout``: the contiguous tensors, or
    pools of shuffled blocks (16-token ``paged``, 64-token ``slab``) with a block table."""
    meta = SimpleNamespace(mask=lambda window: mask)
    if layout == "contiguous":
        return SimpleNamespace(keys=k, values=v, layout=layout, meta=meta)
    b, hk, s, d = k.shape
    bs = 16 if layout == "paged" else 64
    per_row = -(-s // bs)
    order = torch.randperm(b * per_row + 3, generator=torch.Generator().manual_seed(seed))
    table = order[: b * per_row].view(b, per_row)  # block ids scattered over a larger pool

    def pool(x: torch.Tensor) -> torch.Tensor:
        out = torch.randn(b * per_row + 3, hk, bs, d).to(x.dtype)  # garbage in unused slots
        padded = torch.nn.functional.pad(x, (0, 0, 0, per_row * bs - s))
        out[table.reshape(-1)] = (
            padded.view(b, hk, per_row, bs, d).transpose(1, 2).reshape(b * per_row, hk, bs, d)
        )
        return out

    return SimpleNamespace(key_pool=pool(k), value_pool=pool(v), block_table=table,
                           block_size=bs, layout=layout, meta=meta)  # fmt: skip


@SETTINGS
@given(dtype=DTYPES, b=st.integers(1, 2), t=st.sampled_from([1, 2, 5, 16, 17, 40]),
       heads=st.sampled_from([(4, 2), (9, 3), (2, 2), (8, 1)]), s=st.integers(1, 300),
       d=st.sampled_from([16, 24, 64, 80, 128, 256]), sinks=st.booleans(), causal=st.booleans(),
       layout=st.sampled_from(["contiguous", "paged", "slab"]))  # fmt: skip
def test_attention(ext, dtype, b, t, heads, s, d, sinks, causal, layout):
    hq, hk = heads
    q = tensor(1, b, t, hq, d, dtype=dtype).transpose(1, 2)  # [B, Hq, T, D], strided
    k = tensor(2, b, hk, s + 7, d, dtype=dtype)[:, :, :s]  # cache buffer wider than S
    v = tensor(3, b, hk, s + 7, d, dtype=dtype)[:, :, :s]
    if causal:  # queries are the last t positions; the second row is shorter (ragged)
        lens = torch.tensor([s, max(1, s - 5)])[:b]
        keys, qpos = torch.arange(s), lens[:, None] - t + torch.arange(t)
        mask = ((keys <= qpos[..., None]) & (keys < lens[:, None, None]))[:, None]
    else:
        mask = tensor(4, b, 1, t, s, dtype=torch.float32) > -0.5
    mask[..., 0] = True  # no fully masked row
    sink = tensor(5, hq, dtype=dtype) if sinks else None
    got = kernels.attention(q, cache_view(k, v, mask, layout, seed=s), d**-0.5, sink)
    assert got.shape == (b, hq, t, d) and got.dtype == dtype
    f = lambda x: None if x is None else x.float()  # noqa: E731
    ref_view = cache_view(k.float(), v.float(), mask, "contiguous", seed=s)
    ref = native.attention(q.float(), ref_view, d**-0.5, f(sink))
    # outputs are convex combinations of value rows: bound by the largest |v|
    assert_within(got, ref, rel(dtype) * ref.abs() + 1e-5 * v.float().abs().max())


@SETTINGS
@given(dtype=DTYPES, t=st.sampled_from([1, 3, 17]), heads=st.sampled_from([1, 4, 16]),
       s=st.integers(1, 200), rank=st.sampled_from([16, 32, 512]), rope=st.sampled_from([8, 64]),
       layout=st.sampled_from(["contiguous", "paged", "slab"]))  # fmt: skip
def test_latent_attention(ext, dtype, t, heads, s, rank, rope, layout):
    """MLA over latent rows (one KV head, no values): native's values are the rows' first
    ``rank`` dims; avx512 runs its flash kernel with the rows as keys and values."""
    d = rank + rope
    q = tensor(1, 1, heads, t, d, dtype=dtype)
    rows = tensor(2, 1, 1, s, d, dtype=dtype)
    empty = rows[..., :0]
    keys, qpos = torch.arange(s), s - t + torch.arange(t)
    mask = (keys <= qpos[:, None])[None, None] | (keys == 0)
    got = kernels.latent_attention(q, cache_view(rows, rows, mask, layout, seed=s), 0.1, rank)
    ref_view = cache_view(rows.float(), empty.float(), mask, "contiguous", seed=s)
    ref = native.latent_attention(q.float(), ref_view, 0.1, rank)
    assert got.shape == ref.shape == (1, heads, t, rank)
    assert_within(got, ref, rel(dtype) * ref.abs() + 1e-5 * rows.float().abs().max())


@SETTINGS
@given(dtype=MATMUL_DTYPES, n=st.sampled_from([1, 2, 9, 40]), experts=st.integers(1, 6),
       hidden=DIMS, inter=DIMS, act=st.sampled_from(sorted(packing.ACTIVATIONS)))  # fmt: skip
def test_moe(ext, dtype, n, experts, hidden, inter, act):
    """The experts as packed gated MLPs equal native's loop (decode rows call their k experts
    directly; batches group the rows of each hit expert)."""
    k = min(2, experts)
    x = tensor(1, n, hidden, dtype=dtype)
    gate_up = tensor(2, experts, hidden, 2 * inter, dtype=dtype, scale=hidden**-0.5)
    down = tensor(3, experts, inter, hidden, dtype=dtype, scale=inter**-0.5)
    chosen = torch.stack([torch.randperm(experts, generator=torch.Generator().manual_seed(i))[:k]
                          for i in range(n)])  # fmt: skip
    weights = tensor(4, n, k, dtype=torch.float32).abs()
    got = kernels.moe(x, chosen, weights, packing.prepare_moe(gate_up, None, down, None, 1.0,
                                                               0.0, act))  # fmt: skip
    ref = native.moe(x.float(), chosen, weights, native.prepare_moe(
        gate_up.float(), None, down.float(), None, 1.0, 0.0, act))  # fmt: skip
    assert got.shape == x.shape and got.dtype == dtype
    terms = x.float().abs() @ gate_up.float().abs().amax(0)  # bound the down terms coarsely
    bound = terms[:, :inter].abs() @ down.float().abs().amax(0) * weights.sum(-1, keepdim=True)
    assert_within(got, ref, rel(dtype) * (ref.abs() + bound) + 1e-5)


@pytest.mark.parametrize("dtype", MATMUL)
def test_moe_clamped_swiglu_with_biases(ext, dtype):
    """GPT-OSS's experts (biases, clamped SwiGLU): packed linears + the activation between."""
    e, h, i, n = 4, 48, 40, 7
    x = tensor(1, n, h, dtype=dtype)
    gate_up, down = tensor(2, e, h, 2 * i, dtype=dtype) / 7, tensor(3, e, i, h, dtype=dtype) / 6
    b1, b2 = tensor(4, e, 2 * i, dtype=dtype) / 4, tensor(5, e, h, dtype=dtype) / 4
    chosen = torch.tensor([[0, 1], [2, 3], [1, 3], [0, 2], [3, 0], [2, 1], [1, 0]])
    weights = tensor(6, n, 2, dtype=torch.float32).abs()
    args = (1.702, 7.0, "swiglu_oai")
    for rows in (slice(0, 1), slice(None)):  # a decode row, a batch
        got = kernels.moe(x[rows], chosen[rows], weights[rows],
                          packing.prepare_moe(gate_up, b1, down, b2, *args))  # fmt: skip
        ref = native.moe(x[rows].float(), chosen[rows], weights[rows], native.prepare_moe(
            gate_up.float(), b1.float(), down.float(), b2.float(), *args))  # fmt: skip
        # bf16: the gate/up outputs are rounded before the activation (native: fp32 here)
        atol = rel(dtype) * 4 * float(ref.abs().max())
        torch.testing.assert_close(got.float(), ref, rtol=rel(dtype), atol=atol)


@pytest.mark.parametrize("preset", ["int8", "int4"])
def test_moe_quantized_experts(ext, preset):
    """Per-expert quantized matrices: avx512's VNNI gated MLPs equal native's de-quantized
    loop (within the 15-bit activation rounding of two chained matmuls)."""
    from pace_core.quant import QuantizationConfig, quantize
    from pace_core.quant.config import coerce_quantization

    cfg: QuantizationConfig = coerce_quantization(preset)
    e, h, i, n = 5, 64, 96, 6
    x = tensor(1, n, h, dtype=torch.float32)
    gate_up = [quantize(tensor(10 + k, 2 * i, h, dtype=torch.float32) / 8, cfg) for k in range(e)]
    down = [quantize(tensor(20 + k, h, i, dtype=torch.float32) / 10, cfg) for k in range(e)]
    chosen = torch.stack([torch.randperm(e, generator=torch.Generator().manual_seed(k))[:2]
                          for k in range(n)])  # fmt: skip
    weights = tensor(6, n, 2, dtype=torch.float32).abs()
    experts = (gate_up, None, down, None, 1.0, 0.0, "silu")
    ours, ref_w = packing.prepare_moe(*experts), native.prepare_moe(*experts)
    for rows in (slice(0, 1), slice(None)):
        got = kernels.moe(x[rows], chosen[rows], weights[rows], ours)
        ref = native.moe(x[rows], chosen[rows], weights[rows], ref_w)
        torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3)


def test_non_contiguous_and_odd_k(ext):
    """Strided activations are copied; an odd K gets a zero pad lane (bf16 pairs)."""
    for dtype in MATMUL:
        x = tensor(1, 33, 8, dtype=dtype).T  # [8, 33], not contiguous
        w = tensor(2, 40, 33, dtype=dtype)
        got = kernels.linear(x, packing.prepare_linear(w))
        ref, scale = x.float() @ w.float().T, x.float().abs() @ w.float().abs().T
        assert_within(got, ref, rel(dtype) * ref.abs() + 1e-5 * scale)


def test_extension_constants_are_the_cores(ext):
    """The packed layout and activation codes come from the extension; its activation names
    are pace_core.ops.ACTIVATIONS in order (code = index), and a build where they are not is
    refused with the reason."""
    assert tuple(ext.ACTIVATIONS) == ops.ACTIVATIONS
    assert packing.layout() == (ext.BLOCK, ext.BLOCK * ext.GROUP) == (16, 64)
    swapped = SimpleNamespace(ACTIVATIONS=("gelu", "silu", "gelu_tanh", "relu"))
    with pytest.raises(BuildFailed, match="not pace_core.ops.ACTIVATIONS"):
        build.check_constants(swapped)
    gelu = packing.prepare_gated_mlp(*(torch.ones(16, 16),) * 3, "gelu")
    assert gelu.activation == ops.ACTIVATIONS.index("gelu")


def test_packed_layouts(ext):
    """The documented grouped layouts: bf16 [g, p, 32i + 2j + e] = W[64g + 16i + j, 2p + e];
    fp32 [g, k, 16i + j] = W[64g + 16i + j, k]; gate/up interleaved in 16-row blocks."""
    w = torch.arange(70 * 7, dtype=torch.float32).view(70, 7)
    p32 = packing.pack(w)
    assert p32.shape == (2, 7, 64)
    assert p32[1, 3, 2] == w[66, 3] and p32[0, 5, 16 * 2 + 3] == w[35, 5] and p32[1, 0, 6] == 0
    p16 = packing.pack(w.bfloat16())
    assert p16.shape == (2, 4, 128)
    assert p16[1, 2, 2 * 5 + 1] == w[69, 5].bfloat16()  # group 1, block 0, column 5, k = 5
    assert p16[0, 1, 32 * 3 + 2 * 4] == w[52, 2].bfloat16()  # group 0, block 3, column 4, k = 2
    assert p16[0, 3, 1] == 0  # k pad
    gate, up = w[:20], w[20:40] + 1000
    inter = packing.interleave_blocks(gate, up)
    assert inter.shape == (64, 7)  # 20 rows -> 2 blocks of 16 each for gate and up
    assert torch.equal(inter[16:32], up[:16]) and torch.equal(inter[32:36], gate[16:20])
    assert torch.equal(inter[36:48], torch.zeros(12, 7))
    gu = packing.prepare_gated_mlp(gate, up, gate.T.contiguous(), "silu").gate_up
    assert torch.equal(gu, packing.pack(inter))


def test_empty_rows(ext):
    for dtype in MATMUL:
        w = packing.prepare_linear(torch.ones(5, 24, dtype=dtype))
        assert kernels.linear(torch.zeros(0, 24, dtype=dtype), w).shape == (0, 5)


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_split_keys(ext, dtype, layout):
    """Decode over long caches on 2 threads splits the keys and merges the partial softmax
    states: equal to native with sinks, a sliding window and ragged rows."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        b, t, hq, hk, s, d = 2, 1, 8, 1, 700, 64  # 2 (row, KV head) items < 2 per thread
        q = tensor(1, b, hq, t, d, dtype=dtype)
        k, v = tensor(2, b, hk, s, d, dtype=dtype), tensor(3, b, hk, s, d, dtype=dtype)
        lens = torch.tensor([s, 450])
        keys = torch.arange(s)
        mask = (keys < lens[:, None]) & (keys >= lens[:, None] - 600)  # window of 600
        mask = mask[:, None, None, :]
        sink = tensor(5, hq, dtype=dtype)
        got = kernels.attention(q, cache_view(k, v, mask, layout, seed=1), d**-0.5, sink)
        ref_view = cache_view(k.float(), v.float(), mask, "contiguous", seed=1)
        ref = native.attention(q.float(), ref_view, d**-0.5, sink.float())
        assert_within(got, ref, rel(dtype) * ref.abs() + 1e-5 * v.float().abs().max())
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("m", [1, 15, 16, 37, 82])
@pytest.mark.parametrize("dtype", MATMUL)
def test_matmuls_on_two_threads_with_odd_group_counts(ext, dtype, m):
    """2 threads split an odd number of 64-column groups in half groups from 16 rows (a
    2-block tile at the end of one thread's range and the start of the other's), whole groups
    below: linear and gated MLP outputs equal the fp32 reference at 9 groups (SmolLM2's 576
    columns), 3 and a partial last group."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for n, k in ((576, 576), (130, 200), (200, 96)):
            x = tensor(1, m, k, dtype=dtype)
            w = tensor(2, n, k, dtype=dtype, scale=k**-0.5)
            got = kernels.linear(x, packing.prepare_linear(w))
            ref = x.float() @ w.float().T
            terms = x.float().abs() @ w.float().abs().T
            assert_within(got, ref, rel(dtype) * ref.abs() + 1e-5 * terms)
        for hidden, inter in ((576, 1536), (96, 72), (96, 88)):  # 48, 3 and 3 gate/up groups
            x = tensor(3, m, hidden, dtype=dtype)
            gate, up = (tensor(s, inter, hidden, dtype=dtype, scale=hidden**-0.5) for s in (4, 5))
            down = tensor(6, hidden, inter, dtype=dtype, scale=inter**-0.5)
            got = kernels.gated_mlp(x, packing.prepare_gated_mlp(gate, up, down, "silu"))
            xf, gf, uf, df = x.float(), gate.float(), up.float(), down.float()
            h = torch.nn.functional.silu(xf @ gf.T) * (xf @ uf.T)
            ref = h @ df.T
            assert_within(got, ref, rel(dtype) * (ref.abs() + h.abs() @ df.abs().T) + 1e-6)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_attention_decode_rows_in_thread_ranges(ext, layout):
    """Batched decode (one query per row, short ragged caches: no key splits) hands each
    thread a contiguous range of (row, KV head) items: every item is computed once, equal to
    native, for item counts that do and do not divide over 2 threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for b, hk in ((5, 3), (4, 2), (1, 1)):
            hq, s, d = 3 * hk, 150, 64
            q = tensor(1, b, hq, 1, d, dtype=torch.bfloat16)
            k = tensor(2, b, hk, s, d, dtype=torch.bfloat16)
            v = tensor(3, b, hk, s, d, dtype=torch.bfloat16)
            lens = torch.arange(b) * 23 + 40
            mask = (torch.arange(s) < lens[:, None])[:, None, None, :]
            got = kernels.attention(q, cache_view(k, v, mask, layout, seed=2), d**-0.5)
            ref_view = cache_view(k.float(), v.float(), mask, "contiguous", seed=2)
            ref = native.attention(q.float(), ref_view, d**-0.5)
            assert_within(got, ref, rel(torch.bfloat16) * ref.abs() + 1e-5 * v.float().abs().max())
    finally:
        torch.set_num_threads(threads)


def test_huge_page_arena_copies_and_keeps_chunks_alive(ext):
    """Packed weights move into huge-page arenas: equal values, 64-byte aligned, and a tensor
    stays valid after its chunk stops being the arena's current one (> 64 MiB later)."""
    first = tensor(1, 1000, 333, dtype=torch.bfloat16)
    kept = ext.huge_page_copy(first)
    assert torch.equal(kept, first) and kept.data_ptr() % 64 == 0
    filler = [ext.huge_page_copy(torch.ones(4 << 20, dtype=torch.float32)) for _ in range(5)]
    assert all(f.data_ptr() % 64 == 0 for f in filler)
    del filler  # the chunks of the filler go; `kept`'s chunk must stay while it lives
    junk = [torch.full((1 << 22,), 7.0) for _ in range(4)]  # reuse freed memory
    assert torch.equal(kept, first) and float(junk[0][0]) == 7.0
    w = packing.prepare_linear(tensor(2, 40, 33, dtype=torch.bfloat16))
    assert torch.equal(w.weight, packing.pack(tensor(2, 40, 33, dtype=torch.bfloat16)))


@SETTINGS
@given(dtype=DTYPES, n=DIMS, k=DIMS, seed=st.integers(0, 2**16))
def test_packed_rows_are_the_matrix_rows_bit_for_bit(dtype, n, k, seed):
    """A tied embedding reads its lookups from the head's packed copy: they must be exact."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen).to(dtype)
    packed = packing.prepare_linear(w)
    ids = torch.randint(0, n, (7,), generator=gen)
    assert torch.equal(packed.rows(ids), w[ids])


@pytest.mark.parametrize("act", ops.ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_activation_on_views(ext, act, dtype):
    """act(gate) * up on the two halves of one [gate | up] output (3-d and 2-d views, a tail
    of 5 lanes): fp32 math rounded once, against torch in fp32."""
    torch_act = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
                 "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
                 "relu": torch.relu}[act]  # fmt: skip
    for shape in ((2, 3, 2 * 37), (4, 2 * 37), (2 * 37,), (4, 4 * 37)):
        gu = tensor(7, *shape, dtype=dtype, scale=3.0)
        if shape[-1] == 4 * 37:  # halves with a last stride of 2: copied first
            gu = gu[..., ::2]
        gate, up = gu.narrow(-1, 0, 37), gu.narrow(-1, 37, 37)
        got = ext.gated_activation(gate, up, ops.ACTIVATIONS.index(act))
        want = torch_act(gate.float()) * up.float()
        assert got.shape == gate.shape and got.dtype == dtype
        assert_within(got, want, rel(dtype) * want.abs() + 1e-6 * want.abs().max())


@pytest.mark.parametrize("d", [32, 96, 128])
@pytest.mark.parametrize("hq", [1, 3, 8, 9])
def test_attention_decode_items_of_few_rows(ext, d, hq):
    """bf16 decode items of 1-9 query rows (one KV head): on CPUs without AVX512-BF16 up to 8
    rows read keys and values as bf16 pairs widened in registers (attention_pairs.h), 9 widen
    each block; D with a 32-dim tail, sinks, a fully masked 64-key block, ragged rows and the
    keys split over 2 threads. Equal to native in fp32 within bf16 rounding."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        b, t, hk, s = 2, 1, 1, 600
        q = tensor(1, b, hq, t, d, dtype=torch.bfloat16)
        k = tensor(2, b, hk, s, d, dtype=torch.bfloat16)
        v = tensor(3, b, hk, s, d, dtype=torch.bfloat16)
        keys = torch.arange(s)
        live = (keys < torch.tensor([s, 301])[:, None]) & ~((keys >= 64) & (keys < 128))
        mask = live[:, None, None, :]
        sink = tensor(5, hq, dtype=torch.bfloat16)
        got = kernels.attention(q, cache_view(k, v, mask, "contiguous", seed=1), d**-0.5, sink)
        ref_view = cache_view(k.float(), v.float(), mask, "contiguous", seed=1)
        ref = native.attention(q.float(), ref_view, d**-0.5, sink.float())
        assert got.shape == (b, hq, t, d)
        assert_within(got, ref, rel(torch.bfloat16) * ref.abs() + 1e-5 * v.float().abs().max())
    finally:
        torch.set_num_threads(threads)


_SMALL_TEAM = """
import torch
from pace_avx512 import kernels, packing
from pace_native import kernels as native
from types import SimpleNamespace

torch.manual_seed(0)
torch.set_num_threads(2)  # work split in 2 ranges, but OMP_THREAD_LIMIT=1: a team of one
x = torch.randn(37, 576, dtype=torch.bfloat16)
w = (torch.randn(576, 576) / 24).to(torch.bfloat16)
got = kernels.linear(x, packing.prepare_linear(w)).float()
linear_err = ((got - x.float() @ w.float().T).abs().max() / got.abs().max()).item()
b, hq, hk, s, d = 5, 9, 3, 150, 64
q = torch.randn(b, hq, 1, d, dtype=torch.bfloat16)
k, v = (torch.randn(b, hk, s, d, dtype=torch.bfloat16) for _ in range(2))
mask = (torch.arange(s) < torch.arange(b)[:, None] * 23 + 40)[:, None, None, :]
meta = SimpleNamespace(mask=lambda window: mask)
view = lambda k, v: SimpleNamespace(keys=k, values=v, layout="contiguous", meta=meta)
got = kernels.attention(q, view(k, v), d**-0.5).float()
ref = native.attention(q.float(), view(k.float(), v.float()), d**-0.5)
print(linear_err, ((got - ref).abs().max() / ref.abs().max()).item())
"""


def test_work_split_for_two_threads_is_finished_by_a_team_of_one():
    """GEMM column ranges and decode attention items are split for the threads asked for;
    threads done with their own range finish the others'. With OMP_THREAD_LIMIT=1 the team
    has one thread, which must then compute the second range too (all of it, correctly)."""
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
    out = subprocess.run([sys.executable, "-c", _SMALL_TEAM], env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    linear_err, attention_err = map(float, out.stdout.split())
    assert linear_err < 2e-2 and attention_err < 2e-2
