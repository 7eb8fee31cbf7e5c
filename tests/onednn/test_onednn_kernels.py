"""onednn kernels vs pace-native over random shapes (K/N not multiples of 16, M 1..20 and more).

Tolerances, relative to the largest output magnitude: fp32 1e-4 against native fp32. bf16 is
checked against an fp32 reference on the same bf16-rounded inputs: 2^-7 for linear (one
output rounding) and 2^-6 for gated_mlp (up and the gated product are rounded to bf16 too).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pace_native import kernels as native
from support.plugin_tests import assert_close, rand

from pace_core.cpu import detect_cpu

onednn = pytest.importorskip("pace_onednn.kernels", reason="pace-onednn is not installed")
from pace_onednn.plugin import bf16_unavailable  # noqa: E402 (after the skip)

FP32_TOL, BF16_LINEAR_TOL, BF16_MLP_TOL = 1e-4, 2.0**-7, 2.0**-6
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)
dims = st.integers(1, 200)
rows = st.one_of(st.integers(1, 20), st.sampled_from([33, 64, 130, 257]))
# bf16 only where the plugin offers it (AVX512-BF16); elsewhere it declines at resolve time.
dtypes = st.sampled_from([torch.float32] + ([torch.bfloat16] if bf16_unavailable() is None else []))


@SETTINGS
@given(m=rows, k=dims, n=dims, bias=st.booleans(), dtype=dtypes)
def test_linear_matches_native(m, k, n, bias, dtype):
    w, x = rand(n, k, seed=1).to(dtype), rand(2, m, k, seed=2).to(dtype)
    b = rand(n, seed=3).to(dtype) if bias else None
    got = onednn.linear(x, onednn.prepare_linear(w, b))
    assert got.dtype == dtype
    ref = native.linear(x.float(), native.prepare_linear(w.float(), b if b is None else b.float()))
    assert_close(got, ref, FP32_TOL if dtype == torch.float32 else BF16_LINEAR_TOL)


@SETTINGS
@given(m=rows, h=dims, i=dims, act=st.sampled_from(onednn.ACTIVATIONS), dtype=dtypes)
def test_gated_mlp_matches_native(m, h, i, act, dtype):
    gate, up = rand(i, h, seed=4, scale=h**-0.5), rand(i, h, seed=5, scale=h**-0.5)
    down, x = rand(h, i, seed=6, scale=i**-0.5), rand(m, h, seed=7)
    mats = [t.to(dtype) for t in (gate, up, down)]
    got = onednn.gated_mlp(x.to(dtype), onednn.prepare_gated_mlp(*mats, act))
    assert got.dtype == dtype and got.shape == (m, h)
    ref = native.gated_mlp(x.to(dtype).float(),
                           native.prepare_gated_mlp(*(t.float() for t in mats), act))  # fmt: skip
    assert_close(got, ref, FP32_TOL if dtype == torch.float32 else BF16_MLP_TOL)


def test_primitives_cached_per_m_and_bounded():
    w = onednn.prepare_linear(rand(24, 40, seed=8))
    for m in (1, 5, 1, 5, 1):
        w.forward(rand(m, 40, seed=m))
    assert w.cached_shapes == 2  # decode (M=1) and one prefill length, each created once
    for m in range(2, 80):
        w.forward(rand(m, 40, seed=m))
    assert 1 <= w.cached_shapes <= 64


def test_weights_packed_once_into_the_fast_layout(onednn_glue):
    if not detect_cpu().has("avx512f", "avx512bw", "avx512vl", "avx512dq"):
        pytest.skip("brgemm matmul needs avx512_core")
    fp32 = onednn.prepare_linear(rand(37, 100, seed=9))
    assert fp32.packed_bytes >= 37 * 100 * 4
    assert all(fp32.impl(m).startswith("brg:avx512_core") for m in (1, 8, 128))
    if detect_cpu().has("avx512_bf16"):
        bf16 = onednn.prepare_linear(rand(37, 100, seed=9).bfloat16())
        assert all(bf16.impl(m) == "brg:avx512_core_bf16" for m in (1, 8, 128))


def test_strided_input_empty_rows_and_errors():
    w = rand(16, 24, seed=10)
    p = onednn.prepare_linear(w)
    x = rand(3, 5, 24, seed=11)
    assert torch.allclose(onednn.linear(x[:, -1], p), x[:, -1] @ w.T, atol=1e-5)
    assert onednn.linear(x[:, :0], p).shape == (3, 0, 16)
    with pytest.raises(RuntimeError, match="last dim 24"):
        onednn.linear(rand(2, 23, seed=12), p)
    with pytest.raises(RuntimeError, match="differs from weight dtype"):
        onednn.linear(x.bfloat16(), p)
    with pytest.raises(ValueError, match="unknown activation"):
        onednn.prepare_gated_mlp(w, w, w.T, "swish")
