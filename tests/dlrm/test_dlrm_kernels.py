"""The DLRM ops' kernels (native and avx512) against plain-torch float64 references."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from pace_native import dlrm as native
from support.isa import needs_avx512_int8

from pace_core.quant import QuantizationConfig, quantize

BACKENDS = ["native", pytest.param("avx512", marks=needs_avx512_int8)]
BF16_TOL = 2e-2  # relative to the output's largest magnitude: bf16 rounding of inputs/outputs


def kernels(backend: str):
    if backend == "native":
        return native
    from pace_avx512 import dlrm

    return dlrm


def bags(rows: int, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged bags of 0..6 ids (some empty)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 7, (batch,), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    return torch.randint(0, rows, (int(offsets[-1]),), generator=gen), offsets


def reference_bags(table: torch.Tensor, indices, offsets) -> torch.Tensor:
    return F.embedding_bag(indices, table.double(), offsets, mode="sum", include_last_offset=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dim", [128, 20, 200])
def test_embedding_bag_float_tables(backend, dim):
    k = kernels(backend)
    table = torch.randn(300, dim, generator=torch.Generator().manual_seed(dim))
    indices, offsets = bags(300, 37)
    ref = reference_bags(table, indices, offsets)
    out = k.embedding_bag(indices, offsets, k.prepare_embedding_bag(table))
    assert out.dtype == torch.float32 and out.shape == (37, dim)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-6)
    assert (out[offsets[1:] == offsets[:-1]] == 0).all()  # empty bags are zeros
    out16 = k.embedding_bag(indices, offsets, k.prepare_embedding_bag(table.bfloat16()))
    ref16 = reference_bags(table.bfloat16(), indices, offsets)  # the bf16 table's own values
    assert out16.dtype == torch.bfloat16
    assert (out16.double() - ref16).abs().max() <= BF16_TOL * ref16.abs().max()


@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_embedding_bag_equals_the_dequantized_table(backend):
    k = kernels(backend)
    table = torch.randn(500, 128, generator=torch.Generator().manual_seed(1))
    q = quantize(table, QuantizationConfig(bits=8))  # per row: one scale each
    assert q.scales.shape == (500, 1)
    indices, offsets = bags(500, 64, seed=2)
    out = k.embedding_bag(indices, offsets, k.prepare_embedding_bag(q))
    ref = reference_bags(q.dequantize().float(), indices, offsets)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-6)
    # and close to the float table: int8 rows lose < 1/254 of each row's largest value
    float_ref = reference_bags(table, indices, offsets)
    assert (out.double() - float_ref).abs().max() < 0.05


@pytest.mark.parametrize("backend", BACKENDS)
def test_embedding_bag_refuses_grouped_int8_tables(backend):
    k = kernels(backend)
    grouped = quantize(torch.randn(10, 64), QuantizationConfig(bits=8, group_size=32))
    with pytest.raises(ValueError, match="one scale per row"):
        k.prepare_embedding_bag(grouped)


@needs_avx512_int8
def test_avx512_embedding_bag_checks_ids_and_offsets():
    from pace_avx512 import dlrm

    w = dlrm.prepare_embedding_bag(torch.randn(10, 16))
    with pytest.raises(RuntimeError, match="index 10 outside the table's 10 rows"):
        dlrm.embedding_bag(torch.tensor([1, 10]), torch.tensor([0, 1, 2]), w)
    with pytest.raises(RuntimeError, match="offsets decrease"):
        dlrm.embedding_bag(torch.tensor([1, 2]), torch.tensor([0, 2, 1]), w)


def cross_layers(d: int, r: int, n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(r, d, generator=gen) / d**0.5, torch.randn(d, r, generator=gen) / r**0.5,
             torch.randn(d, generator=gen) * 0.1) for _ in range(n)]  # fmt: skip


def reference_cross(x0: torch.Tensor, layers) -> torch.Tensor:
    x0 = x0.double()
    xl = x0
    for v, u, b in layers:
        xl = x0 * ((xl @ v.double().T) @ u.double().T + b.double()) + xl
    return xl


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(160, 32, 2), (96, 64, 3), (3456 // 8, 64, 1)])
def test_cross_interaction_float(backend, shape):
    d, r, n = shape
    k = kernels(backend)
    layers = cross_layers(d, r, n)
    x0 = torch.randn(33, d, generator=torch.Generator().manual_seed(5))
    ref = reference_cross(x0, layers)
    out = k.cross_interaction(x0, k.prepare_cross_interaction(layers))
    assert out.dtype == torch.float32 and out.shape == x0.shape
    torch.testing.assert_close(out.double(), ref, atol=1e-4 * ref.abs().max().item(), rtol=1e-4)
    bf = [tuple(t.bfloat16() for t in layer) for layer in layers]
    out16 = k.cross_interaction(x0.bfloat16(), k.prepare_cross_interaction(bf))
    ref16 = reference_cross(x0.bfloat16(), bf)
    assert out16.dtype == torch.bfloat16
    assert (out16.double() - ref16).abs().max() <= BF16_TOL * ref16.abs().max()


def w8a8(layers):
    cfg = QuantizationConfig(bits=8)
    return [(replace(quantize(v, cfg), activations="int8"),
             replace(quantize(u, cfg), activations="int8"), b) for v, u, b in layers]  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_int8_cross_interaction_is_close_to_fp32(backend):
    k = kernels(backend)
    layers = cross_layers(160, 64, 3, seed=3)
    x0 = torch.randn(64, 160, generator=torch.Generator().manual_seed(4))
    ref = reference_cross(x0, layers)
    out = k.cross_interaction(x0, k.prepare_cross_interaction(w8a8(layers)))
    err = (out.double() - ref).abs().max() / ref.abs().max()
    assert 0 < err < 0.02  # quantized (not exact), within int8's error


@needs_avx512_int8
def test_avx512_w8a8_matches_native_w8a8():
    """Both backends quantize activations the same way (per row and 32 values, amax / 127,
    round to nearest even): they agree to fp32 accumulation order, far below int8's error."""
    from pace_avx512 import dlrm

    layers = w8a8(cross_layers(160, 64, 3, seed=6))
    x0 = torch.randn(40, 160, generator=torch.Generator().manual_seed(7))
    ours = dlrm.cross_interaction(x0, dlrm.prepare_cross_interaction(layers))
    ref = native.cross_interaction(x0, native.prepare_cross_interaction(layers))
    torch.testing.assert_close(ours, ref, atol=1e-4 * ref.abs().max().item(), rtol=1e-4)


def test_native_w8a8_rounds_activations_to_int8():
    from pace_native.kernels import int8_activations

    x = torch.randn(3, 64)
    q = int8_activations(x)
    for group in range(2):
        part, orig = q[:, group * 32 : group * 32 + 32], x[:, group * 32 : group * 32 + 32]
        scale = orig.abs().amax(1, keepdim=True) / 127
        codes = part / scale
        torch.testing.assert_close(codes, codes.round(), atol=1e-4, rtol=0)
        assert (part - orig).abs().max() <= scale.max() / 2 + 1e-6
