"""pace-avx512's W8A8 GEMM (csrc/igemm.cpp) against an exact model of what it computes.

Weights: int8 with one scale per row (``quantization="w8a8"``), packed as their own kind. Each
activation row is quantized per group of ``QuantizedWeight.activation_group`` values (64 when
K is a multiple of 64, else 32; static scales: 32) to int8 (``amax / 127``, round half to even)
and multiplied by the codes in int32; the reference does the same in float64 from the same
codes (pace_native's ``int8_activations``), so the two agree to fp32 rounding (``rtol 1e-5``;
a bf16 output adds one bf16 rounding): any layout, tail, group or compensation bug shows.
Hypothesis draws the shapes (every tile height 1-4, column tails, both group sizes, threads).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.isa import needs_avx512_int8

pytest.importorskip("pace_avx512", reason="pip install --no-deps -e plugins/avx512")

from pace_avx512 import qpacking
from pace_native.kernels import int8_activations
from support.kernel_threads import every_thread

from pace_core.quant import QuantizationConfig, QuantizedWeight, coerce_quantization, quantize

pytestmark = needs_avx512_int8  # the int8 kernels use vpdpbusd

W8A8 = coerce_quantization("w8a8")


def w8a8_weight(n: int, k: int, seed: int = 0) -> QuantizedWeight:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) / k**0.5
    w[min(1, n - 1)] = 0.0  # an all-zero row (zero scale)
    return quantize(w, W8A8)


def reference(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel's result in float64: the int8-rounded activations times the codes' values."""
    xq = int8_activations(x.float(), w.activation_scales, w.activation_group)
    out = xq.double() @ w.dequantize(dtype=torch.float32).double().T
    return (out if bias is None else out + bias.double()).float()


def check(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    tol = 1e-5 if dtype == torch.float32 else 2**-8  # one bf16 rounding at the end
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * want.abs().max())


def test_per_channel_w8a8_packs_as_its_own_kind():
    w = w8a8_weight(40, 128)
    packed = qpacking.prepare_linear(w)
    assert packed.kind == qpacking.KINDS["w8a8"] and packed.int8_activations
    assert tuple(packed.weight.shape) == (3, 64 + 16 * 128)  # 16 fp32 scales, then the codes
    assert w.activation_group == 64 and w8a8_weight(40, 96).activation_group == 32
    grouped = quantize(
        torch.randn(32, 128), QuantizationConfig(bits=8, group_size=32, activations="int8")
    )
    assert qpacking.prepare_linear(grouped).kind == qpacking.KINDS["int8"]  # groups: qlinear.cpp
    assert grouped.activation_group == 32


def test_packed_rows_are_the_weight_values():
    w = w8a8_weight(37, 96)
    packed = qpacking.prepare_linear(w)
    ids = torch.tensor([0, 1, 15, 16, 36])
    want = w.dequantize(dtype=torch.float32)[ids]
    torch.testing.assert_close(packed.rows(ids).float(), want, rtol=0, atol=0)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    m=st.integers(1, 13),
    n=st.integers(1, 120),
    groups=st.integers(1, 12),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    threads=st.sampled_from([1, 2]),
    bias=st.booleans(),
)
def test_w8a8_gemm_matches_its_model(ext, m, n, groups, dtype, threads, bias):
    k = 32 * groups  # odd group counts take groups of 32, even ones 64
    w = w8a8_weight(n, k, seed=n + k)
    b = torch.linspace(-1, 1, n) if bias else None
    packed = qpacking.prepare_linear(w, b)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
    x[0, :32] = 0.0  # an all-zero activation group
    with every_thread(ext, threads):
        got = ext.qlinear(x, packed.weight, packed.bias, n, packed.kind, True)
    assert got.dtype == dtype and got.shape == (m, n)
    check(got, reference(x, w, b), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_static_activation_scales(ext, dtype):
    """Calibrated scales (one per 32 inputs, shared by every row; DLRM's int8-static): codes
    past them clamp to +-127."""
    n, k = 50, 128
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(5)).to(dtype)
    scales = x.float().abs().reshape(9, k // 32, 32).amax(dim=(0, 2)) / 127 * 0.7  # some clamp
    w = w8a8_weight(n, k)
    w = QuantizedWeight(w.format, w.shape, w.dtype, w.data, w.scales, None, w.group_size, "int8",
                        scales)  # fmt: skip
    packed = qpacking.prepare_linear(w)
    got = ext.qlinear(x, packed.weight, packed.bias, n, packed.kind, True, True, packed.act_scales)
    check(got, reference(x, w, None), dtype)


@pytest.mark.parametrize("threads", [1, 2])
def test_rows_alone_or_batched_are_the_same(ext, threads):
    """A row's output does not depend on the rows computed with it (decode, batched decode,
    verification and prefill agree bit for bit): rows are quantized on their own and every
    tile height sums in the same order."""
    n, k = 100, 512
    packed = qpacking.prepare_linear(w8a8_weight(n, k))
    x = torch.randn(23, k, generator=torch.Generator().manual_seed(11)).bfloat16()
    with every_thread(ext, threads):
        batched = ext.qlinear(x, packed.weight, packed.bias, n, packed.kind, True)
        alone = torch.cat([ext.qlinear(x[i : i + 1], packed.weight, packed.bias, n, packed.kind,
                                       True) for i in range(23)])  # fmt: skip
    assert torch.equal(batched, alone)


def test_stacked_w8a8_parts_pack_as_their_concatenation():
    parts = [w8a8_weight(n, 128, seed=n) for n in (32, 16, 48)]
    stacked, _ = qpacking.pack(QuantizedWeight.cat(parts))
    packed, kind = qpacking.pack(parts)
    assert kind == qpacking.KINDS["w8a8"] and torch.equal(packed, stacked)
