"""pace-avx512's kinds for GGUF k-quants against their exact model and their older layouts.

``q6_k`` packs as kind ``q6`` (the file's fp16 d and int8 sub-block scales, 6-bit codes as
the 4-bit nibble lines plus 2 lines of high bits: 6.625 bits per weight) and ``q4_k`` as kind
``q4k`` (the file's fp16 d, dmin and 6-bit sub-block tables, 4.625 bits per weight): their rows
are pace_core's de-quantization exactly, and ``int8-g16`` / ``int4`` (the sub-block products
rounded to fp16; 9 and 5 bits) are within that rounding. The model is
``support.quant_kernels.reference`` (test_quantized_kernels.py's); on int8 activations q6 is
bit for bit ``support.quant_kernels.q6k_super``. Runs on any AVX-512 CPU with VNNI (the panel
cases are skipped without AVX512-BF16).
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
from support.quant_kernels import activation_span, panel_rows, q6k_super, reference, weight

from pace_core.quant import QuantizedWeight

pytestmark = needs_avx512_int8  # the int8 kernels use vpdpbusd

KIND_MODES = {  # (int8 activations, qpanel_rows)
    "split": (False, 0),
    "int8": (True, 0),
    "panel-from-16": (False, 16),
}


# -- GGUF q6_k: kind "q6" (the file's d and int8 sub-block scales, 6-bit codes: 6.625 bits) ---
# ``int8-g16`` holds the same weight as 8-bit codes with the sub-block scales d sc rounded to
# fp16 per 16 k (9 bits per weight: the layout q6 replaced); q6 computes d sc in fp32 as GGUF
# does, so its rows are pace_core's de-quantization exactly.


def q6_k_blocks(n: int, k: int, seed: int) -> QuantizedWeight:
    """Random q6_k super-blocks: any 6-bit code, any int8 sub-block scale (-128 and 127 in row
    0), d in 1e-4..1.1e-3 (row 1 all zero: d = 0)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (n, k // 256, 210), dtype=torch.uint8, generator=gen)
    blocks[0, :, 192], blocks[0, :, 193] = 128, 127  # sc -128, 127
    d = (torch.rand(n, k // 256, generator=gen) * 1e-3 + 1e-4).half()
    blocks[..., 208:210] = d.unsqueeze(-1).view(torch.uint8)
    blocks[1, :, 208:210] = 0
    return QuantizedWeight("q6_k", (n, k), torch.float32, blocks.reshape(n, -1))


@pytest.mark.parametrize("k", [256, 4096])
def test_q6_k_packs_at_6_625_bits_per_weight(k):
    """Per block of 16 rows and super-block of 256 k: fp16 d [16], the int8 sub-block scales
    [16][16], 32 bytes of padding, 8 groups of 4 nibble lines and 2 lines of high bits: 320 +
    3072 = 3392 bytes, 6.625 bits per weight (the file: 6.5625), whole 64-byte lines.
    int8-g16 takes 576 bytes per 32 k (9 bits)."""
    q = weight("q6_k", 40, k)
    packed, kind = qpacking.pack(q)
    assert kind == qpacking.KINDS["q6"] and packed.shape == (3, k // 256 * 3392)
    assert packed.shape[1] * 8 / (16 * k) == 6.625
    wide, wide_kind = qpacking.pack(q, kind="int8-g16")
    assert wide_kind == qpacking.KINDS["int8-g16"] and wide.shape[1] * 8 / (16 * k) == 9
    with pytest.raises(ValueError, match="cannot pack q4_k as kind int8-g16"):
        qpacking.pack(weight("q4_k", 16, 256), kind="int8-g16")


def test_q6_groups_hold_each_16_k_as_its_high_line_then_its_nibble_lines():
    """The byte layout the kernels read front to back (csrc/qblock.h q6_high_line,
    q6_nibble_line): after a super-block's 320 bytes of tables, group g's 384 bytes hold, per
    16 k s, the high line (bits 2i, 2i + 1 of byte 4j + e: quad 4s + i's u >> 4, row j,
    k = 4 quad + e), then the nibble lines 2s and 2s + 1 (quad 2v in the low nibbles, 2v + 1
    in the high ones). Reading the high lines after all four nibble lines held the 15-bit
    decode GEMV at ~0.6 of a streaming read on Zen 4."""
    q = q6_k_blocks(16, 256, 7)
    packed, _ = qpacking.pack(q)
    codes, _ = qpacking._codes_tables(q, slice(None), qpacking.KINDS["q6"])
    u = (codes.to(torch.int16) + 32).reshape(16, 8, 8, 4)  # [row j, group, quad, e]
    for g in range(8):
        group = packed[0, 320 + 384 * g : 320 + 384 * (g + 1)].reshape(6, 16, 4)  # [line, j, e]
        quads = u[:, g].permute(1, 0, 2)  # [quad, j, e]
        for s in range(2):
            high = sum((quads[4 * s + i] >> 4) << (2 * i) for i in range(4))
            assert torch.equal(group[3 * s].to(torch.int16), high), (g, s)
            for v in (2 * s, 2 * s + 1):
                line = (quads[2 * v] & 15) | ((quads[2 * v + 1] & 15) << 4)
                assert torch.equal(group[3 * s + 1 + v % 2].to(torch.int16), line), (g, v)


@pytest.mark.parametrize("k", [256, 1280])  # 1 and 5 super-blocks
def test_q6_packed_rows_are_ggufs_values(k):
    """The packed rows (``qpacked_rows``: a tied embedding's lookup) are pace_core's
    de-quantization bit for bit, d sc q in fp32, on every code and sub-block scale."""
    q = q6_k_blocks(37, k, k)
    packed = qpacking.prepare_linear(q)
    assert packed.kind == qpacking.KINDS["q6"]
    ids = torch.tensor([0, 1, 2, 15, 16, 31, 36])
    assert torch.equal(packed.rows(ids), q.dequantize(ids, torch.float32))


@pytest.mark.parametrize("mode", list(KIND_MODES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [256, 1280])
@pytest.mark.parametrize("threads", [1, 2])
def test_q6_kind_matches_its_model(ext, mode, dtype, k, threads):
    """Kind q6 against the exact model of the native de-quantized weight (int8 activations:
    ``q6k_super``, bit for bit): the decode GEMV (M = 1), the tiles (M = 2..15, every height
    and tail), the bf16 panel (M >= 16, AVX512-BF16 builds), split or int8 activations, fp32
    and bf16, 1 and 2 threads, a tail block of 4 rows, 1 and 5 super-blocks."""
    int8, panel_from = KIND_MODES[mode]
    if dtype == torch.float32 and int8:
        pytest.skip("fp32 rows keep the split (test_fp32_rows_never_take_int8_activations)")
    n = 100
    q = q6_k_blocks(n, k, k + threads)
    bias = torch.linspace(-1, 1, n)
    packed = qpacking.prepare_linear(q, bias=bias, int8_activations=int8)
    w = q.dequantize(torch.arange(n), torch.float32)
    with panel_rows(ext, panel_from), every_thread(ext, threads):
        for m in range(1, 20):
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
            x[0, :32] = 0.0  # an all-zero activation group
            got = ext.qlinear(x, packed.weight, bias, n, packed.kind, int8)
            path = qpacking.qlinear_path(m, dtype, int8, packed.kind)
            if path == "int8":
                assert torch.equal(got, (q6k_super(x, q) + bias).to(dtype)), m
            want = reference(x, w, path, activation_span(packed.kind, path)) + bias
            tol = 1e-5 if dtype == torch.float32 else 2**-8
            torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * want.abs().max())


def test_q6_is_int8_g16_within_its_fp16_scales(ext):
    """q6_k packed as int8-g16 against q6: close, not bit-equal. int8-g16 rounds each scale
    d sc to fp16 (within 2^-11 relative), so each weight is within 2^-11 |d sc q| of q6's and
    each output within that bound times |x| summed (plus the fp32 sums' rounding); the codes
    and the 15-bit activations are the same."""
    n, k = 100, 512
    q = q6_k_blocks(n, k, 5)
    own = qpacking.prepare_linear(q)
    wide = qpacking.prepare_linear(q, kind="int8-g16")
    ids = torch.arange(n)
    a, b = own.rows(ids), wide.rows(ids)
    bound = 2**-11 * a.abs()
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
