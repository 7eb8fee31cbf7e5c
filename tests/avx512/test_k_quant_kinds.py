"""pace-avx512's kinds for GGUF k-quants against their exact model and their older layouts.

``q6_k`` packs as kind ``q6`` (6-bit codes: the 4-bit nibble lines plus 2 lines of high bits,
7 bits per weight) and computes bit for bit as ``int8-g16`` (8-bit codes, 9 bits) on every
path. ``q4_k`` packs as kind ``q4k`` (the file's fp16 d, dmin and 6-bit sub-block tables, 4.625
bits per weight): its rows are pace_core's de-quantization exactly, and ``int4`` (the sub-block
products rounded to fp16, 5 bits) is within that rounding. The model is
``support.quant_kernels.reference`` (test_quantized_kernels.py's); on int8 activations q6 is
bit for bit ``support.quant_kernels.folded``. Runs on any AVX-512 CPU with
VNNI (the panel cases are skipped without AVX512-BF16).
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from support.isa import needs_avx512_int8

pytest.importorskip("pace_avx512", reason="pip install --no-deps -e plugins/avx512")
pytest.importorskip("gguf", reason="the GGUF block writers need the gguf package")

from pace_avx512 import qpacking
from support.kernel_threads import every_thread
from support.quant_kernels import activation_span, folded, panel_rows, reference, weight

from pace_core.quant import QuantizedWeight

pytestmark = needs_avx512_int8  # the int8 kernels use vpdpbusd

KIND_MODES = {  # (int8 activations, qpanel_rows)
    "split": (False, 0),
    "int8": (True, 0),
    "panel-from-16": (False, 16),
}


# -- GGUF q6_k: kind "q6" (6-bit codes: the 4-bit nibble lines + 2 lines of high bits) -------
# ``int8-g16`` holds the same weight as 8-bit codes (the layout q6 replaced: 9 bits per weight)
# and the kernels compute bit for bit the same numbers from either, on every path.


def q6_codes(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random q6_k-like codes int8 [n, k] in -32..31 (the extremes in row 0) and fp16 scales
    [n, k / 16] (a zero row 1), rows a multiple of 16."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(-32, 32, (n, k), generator=gen).to(torch.int8)
    codes[0, ::2], codes[0, 1::2] = -32, 31
    scales = (torch.rand(n, k // 16, generator=gen) * 0.02 + 1e-3).half()
    scales[1] = 0.0
    return codes, scales


def q6_pair(codes: torch.Tensor, scales: torch.Tensor, n: int, k: int, int8: bool):
    """The same weight packed as kind q6 and as int8-g16 (any number of groups of 32)."""
    return [
        qpacking.QPackedLinear(
            qpacking._block_bytes(codes, [scales], qpacking.KINDS[kind]), None,
            qpacking.KINDS[kind], n, k, torch.float32, int8,
        )
        for kind in ("q6", "int8-g16")
    ]  # fmt: skip


@pytest.mark.parametrize("k", [256, 4096])
def test_q6_k_packs_at_7_bits_per_weight(k):
    """scales [2][16] + 4 nibble lines + 2 high lines: 448 bytes per block of 16 rows and
    32 k (7 bits per weight, the file has 6.5625); int8-g16 took 576 (9 bits)."""
    q = weight("q6_k", 40, k)
    packed, kind = qpacking.pack(q)
    assert kind == qpacking.KINDS["q6"]
    assert packed.shape[1] * 8 / (16 * k) <= 7.1
    wide, wide_kind = qpacking.pack(q, kind="int8-g16")
    assert wide_kind == qpacking.KINDS["int8-g16"] and wide.shape[1] * 8 / (16 * k) == 9
    with pytest.raises(ValueError, match="cannot pack q4_k as kind int8-g16"):
        qpacking.pack(weight("q4_k", 16, 256), kind="int8-g16")


@pytest.mark.parametrize("k", [256, 544])  # 8 groups; 17 (an odd number)
def test_q6_packed_rows_are_the_codes_times_scales(k):
    n = 48
    codes, scales = q6_codes(n, k, k)
    q6, wide = q6_pair(codes, scales, n, k, False)
    ids = torch.tensor([0, 1, 2, 15, 16, 31, 47])
    got = q6.rows(ids)
    want = codes[ids].float() * scales[ids].float().repeat_interleave(16, dim=1)
    assert torch.equal(got, want) and torch.equal(got, wide.rows(ids))


@pytest.mark.parametrize("mode", list(KIND_MODES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [544, 2048])  # an odd number of groups of 32 (17), 64
@pytest.mark.parametrize("threads", [1, 2])
def test_q6_kind_computes_as_int8_g16(ext, mode, dtype, k, threads):
    """Kind q6 against int8-g16 on the same weight, bit for bit, and against the exact model
    (int8 activations: the folded arithmetic, bit for bit): the decode GEMV (M = 1), the
    tiles (M = 2..13, every height and tail), the bf16 panel (M >= 16, AVX512-BF16 builds),
    split or int8 activations, fp32 and bf16, 1 and 2 threads, a tail block of 4 rows."""
    int8, panel_from = KIND_MODES[mode]
    if dtype == torch.float32 and int8:
        pytest.skip("fp32 rows keep the split (test_fp32_rows_never_take_int8_activations)")
    n = 100
    codes, scales = q6_codes(112, k, k + threads)
    q6, wide = q6_pair(codes, scales, n, k, int8)
    w = q6.rows(torch.arange(n))
    bias = torch.linspace(-1, 1, n)
    with panel_rows(ext, panel_from):
        for m in (*range(1, 14), 16, 19):
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
            x[0, :32] = 0.0  # an all-zero activation group
            with every_thread(ext, threads):
                got = ext.qlinear(x, q6.weight, bias, n, q6.kind, int8)
                same = ext.qlinear(x, wide.weight, bias, n, wide.kind, int8)
            assert torch.equal(got, same), m
            if int8:
                exact = folded(x, codes[:n], scales[:n].float()) + bias
                assert torch.equal(got, exact.to(dtype)), m
            want = reference(x, w, qpacking.qlinear_path(m, dtype, int8, q6.kind)) + bias
            tol = 1e-5 if dtype == torch.float32 else 2**-8
            torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * want.abs().max())


@pytest.mark.parametrize("int8", [False, True])
def test_q6_k_weight_computes_as_int8_g16(ext, int8):
    """A real q6_k weight (rows from its super-blocks) packed both ways: the same outputs."""
    n, k = 100, 512
    q = weight("q6_k", n, k)
    q6 = qpacking.prepare_linear(q, int8_activations=int8)
    wide = qpacking.prepare_linear(q, int8_activations=int8, kind="int8-g16")
    assert (q6.kind, wide.kind) == (qpacking.KINDS["q6"], qpacking.KINDS["int8-g16"])
    assert torch.equal(q6.rows(torch.arange(n)), wide.rows(torch.arange(n)))
    for m in (1, 3, 16):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16()
        got = ext.qlinear(x, q6.weight, q6.bias, n, q6.kind, int8)
        assert torch.equal(got, ext.qlinear(x, wide.weight, wide.bias, n, wide.kind, int8))


# -- GGUF q4_k: kind "q4k" (the file's d, dmin and 6-bit sub-block tables: 4.625 bits) -------
# ``int4`` holds the same weight with the sub-block scales d sc and mins -dmin m rounded to fp16
# per group of 32 (5 bits per weight: the layout q4k replaced); q4k computes them in fp32 as
# GGUF does, so its rows are pace_core's de-quantization exactly.


def q4_k_blocks(n: int, k: int, seed: int) -> QuantizedWeight:
    """Random q4_k super-blocks: any 6-bit sub-block scale and min, any code, d and dmin in
    1e-4..1.1e-3 (row 1 all zero: d = dmin = 0)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (n, k // 256, 144), dtype=torch.uint8, generator=gen)
    d, dmin = (torch.rand(2, n, k // 256, generator=gen) * 1e-3 + 1e-4).half()
    blocks[..., 0:2] = d.unsqueeze(-1).view(torch.uint8)
    blocks[..., 2:4] = dmin.unsqueeze(-1).view(torch.uint8)
    blocks[1, :, :4] = 0
    return QuantizedWeight("q4_k", (n, k), torch.float32, blocks.reshape(n, -1))


@pytest.mark.parametrize("k", [256, 2048])
def test_q4_k_packs_at_4_625_bits_per_weight(k):
    """Per block of 16 rows and super-block of 256 k: fp16 d and dmin [16], the sub-block
    scales and mins as bytes [8][16] each, 8 groups of 4 nibble lines: 320 + 2048 = 2368 bytes,
    4.625 bits per weight (the file: 4.5), whole 64-byte lines (no padding but the rows': 40
    rows take 3 blocks). int4 took 320 bytes per 32 k (5 bits)."""
    q = weight("q4_k", 40, k)
    packed, kind = qpacking.pack(q)
    assert kind == qpacking.KINDS["q4k"] and packed.shape == (3, k // 256 * 2368)
    assert packed.shape[1] * 8 / (16 * k) == 4.625
    wide, wide_kind = qpacking.pack(q, kind="int4")
    assert wide_kind == qpacking.KINDS["int4"] and wide.shape[1] * 8 / (16 * k) == 5
    with pytest.raises(ValueError, match="cannot pack q6_k as kind int4"):
        qpacking.pack(weight("q6_k", 16, 256), kind="int4")


@pytest.mark.parametrize("k", [256, 1280])  # 1 and 5 super-blocks
def test_q4k_packed_rows_are_ggufs_values(k):
    """The packed rows (``qpacked_rows``: a tied embedding's lookup) are pace_core's
    de-quantization bit for bit, d sc u - dmin m in fp32, on every sub-block scale and min."""
    q = q4_k_blocks(37, k, k)
    packed = qpacking.prepare_linear(q)
    assert packed.kind == qpacking.KINDS["q4k"]
    ids = torch.tensor([0, 1, 2, 15, 16, 31, 36])
    assert torch.equal(packed.rows(ids), q.dequantize(ids, torch.float32))


@pytest.mark.parametrize("mode", list(KIND_MODES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [256, 1280])
@pytest.mark.parametrize("threads", [1, 2])
def test_q4k_kind_matches_its_model(ext, mode, dtype, k, threads):
    """Kind q4k against the exact model of the native de-quantized weight: the decode GEMV
    (M = 1), the tiles (M = 2..15, every height and tail), the bf16 panel (M >= 16, AVX512-BF16
    builds), split or int8 activations, fp32 and bf16, 1 and 2 threads, a tail block of 4
    rows, 1 and 5 super-blocks."""
    int8, panel_from = KIND_MODES[mode]
    if dtype == torch.float32 and int8:
        pytest.skip("fp32 rows keep the split (test_fp32_rows_never_take_int8_activations)")
    n = 100
    q = q4_k_blocks(n, k, k + threads)
    bias = torch.linspace(-1, 1, n)
    packed = qpacking.prepare_linear(q, bias=bias, int8_activations=int8)
    w = q.dequantize(torch.arange(n), torch.float32)
    with panel_rows(ext, panel_from), every_thread(ext, threads):
        for m in range(1, 20):
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
            x[0, :32] = 0.0  # an all-zero activation group
            got = ext.qlinear(x, packed.weight, bias, n, packed.kind, int8)
            path = qpacking.qlinear_path(m, dtype, int8, packed.kind)
            want = reference(x, w, path, activation_span(packed.kind, path)) + bias
            tol = 1e-5 if dtype == torch.float32 else 2**-8
            torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * want.abs().max())


@pytest.mark.parametrize("source", ["quantized", "random-blocks"])
def test_q4k_is_int4_within_its_fp16_tables(ext, source):
    """q4_k packed as int4 against q4k: close, not bit-equal. int4 rounds each group's scale
    d sc and min -dmin m to fp16 (nearest: within 2^-11 relative, all normal here), so each
    of its weights is within 2^-11 (s u + |m|) of q4k's, and each output within that bound
    times |x| summed (plus the fp32 sums' rounding, 1e-5 of the largest): the same codes and
    activations (15-bit, quantized alike; on int8 ones q4k takes a scale per 256, int4 per
    32), only the tables differ."""
    n, k = 100, 512
    q = weight("q4_k", n, k) if source == "quantized" else q4_k_blocks(n, k, 5)
    own = qpacking.prepare_linear(q)
    wide = qpacking.prepare_linear(q, kind="int4")
    codes, (d, dmin, sc, mn) = qpacking._codes_tables(q, slice(None), qpacking.KINDS["q4k"])
    per_group = partial(torch.repeat_interleave, repeats=8, dim=1)
    scale = (per_group(d.float()) * sc.float()).repeat_interleave(32, dim=1)
    low = (per_group(dmin.float()) * mn.float()).repeat_interleave(32, dim=1)
    bound = 2**-11 * (scale * codes.float() + low)
    ids = torch.arange(n)
    a, b = own.rows(ids), wide.rows(ids)
    assert not torch.equal(a, b)
    assert bool(((a - b).abs() <= bound + 2**-22 * a.abs()).all())
    for m in (1, 3, 16):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16()
        got = ext.qlinear(x, own.weight, own.bias, n, own.kind, False)
        other = ext.qlinear(x, wide.weight, wide.bias, n, wide.kind, False)
        slack = x.float().abs() @ bound.T + 1e-5 * got.float().abs().max()
        assert bool(
            ((got.float() - other.float()).abs() <= slack + 2**-8 * got.float().abs()).all()
        )
