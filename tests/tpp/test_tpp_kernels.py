"""tpp kernels vs pace-native over random shapes, including non-multiples of the blocks.

Tolerances, relative to the largest output magnitude: fp32 1e-4 against native fp32. bf16 is
checked against an fp32 reference on the same bf16-rounded inputs: 2^-7 for linear/qkv (one
output rounding) and 2^-6 for gated_mlp (the intermediate is rounded to bf16 too).
"""

from __future__ import annotations

import os
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pace_native import kernels as native
from support.gil import assert_runs_without_gil
from support.plugin_tests import assert_close, rand

tpp = pytest.importorskip("pace_tpp.kernels", reason="pace-tpp is not installed")

FP32_TOL, BF16_LINEAR_TOL, BF16_MLP_TOL = 1e-4, 2.0**-7, 2.0**-6
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)
dims = st.integers(1, 160)
rows = st.sampled_from([1, 2, 3, 8, 17, 64, 65, 130])
blocks = st.fixed_dictionaries({"PACE_TPP_BN": st.sampled_from(["16", "32", "64"]),
                                "PACE_TPP_BK": st.sampled_from(["16", "32", "64"]),
                                "PACE_TPP_BM": st.sampled_from(["1", "4", "64"])})  # fmt: skip
dtypes = st.sampled_from([torch.float32, torch.bfloat16])


def reference(fn, prepare, x, *weights, dtype):
    """Native fp32 on the same (dtype-rounded) inputs."""
    up = [w.float() if isinstance(w, torch.Tensor) else w for w in weights]
    return fn(x.to(dtype).float(), prepare(*up))


@SETTINGS
@given(m=rows, k=dims, n=dims, bias=st.booleans(), dtype=dtypes, env=blocks)
def test_linear_matches_native(m, k, n, bias, dtype, env):
    w, x = rand(n, k, seed=1).to(dtype), rand(2, m, k, seed=2).to(dtype)
    b = rand(n, seed=3).to(dtype) if bias else None
    with mock.patch.dict(os.environ, env):
        got = tpp.linear(x, tpp.prepare_linear(w, b))
    assert got.dtype == dtype
    ref = native.linear(x.float(), native.prepare_linear(w.float(), b if b is None else b.float()))
    assert_close(got, ref, FP32_TOL if dtype == torch.float32 else BF16_LINEAR_TOL)


@SETTINGS
@given(m=rows, k=dims, sizes=st.tuples(dims, dims, dims), bias=st.booleans(), dtype=dtypes,
       env=blocks)  # fmt: skip
def test_qkv_matches_native(m, k, sizes, bias, dtype, env):
    ws = [rand(s, k, seed=i).to(dtype) for i, s in enumerate(sizes)]
    bs = [rand(s, seed=10 + i).to(dtype) for i, s in enumerate(sizes)] if bias else None
    x = rand(1, m, k, seed=20).to(dtype)
    with mock.patch.dict(os.environ, env):
        got = tpp.qkv_proj(x, tpp.prepare_qkv(ws, bs))
    up = [w.float() for w in ws], bs and [b.float() for b in bs]
    ref = native.qkv_proj(x.float(), native.prepare_qkv(*up))
    assert len(got) == 3
    for g, r in zip(got, ref):
        assert_close(g, r, FP32_TOL if dtype == torch.float32 else BF16_LINEAR_TOL)


@SETTINGS
@given(m=rows, hidden=dims, inter=st.integers(1, 300), dtype=dtypes, env=blocks,
       act=st.sampled_from(["silu", "gelu", "gelu_tanh", "relu"]))  # fmt: skip
def test_gated_mlp_matches_native(m, hidden, inter, dtype, env, act):
    gate, up = rand(inter, hidden, seed=1, scale=0.2), rand(inter, hidden, seed=2, scale=0.2)
    down = rand(hidden, inter, seed=3, scale=0.2)
    x = rand(m, hidden, seed=4).to(dtype)
    with mock.patch.dict(os.environ, env):
        w = tpp.prepare_gated_mlp(gate.to(dtype), up.to(dtype), down.to(dtype), act)
        got = tpp.gated_mlp(x, w)
    assert got.dtype == dtype
    rounded = [t.to(dtype).float() for t in (gate, up, down)]
    ref = native.gated_mlp(x.float(), native.prepare_gated_mlp(*rounded, act))
    assert_close(got, ref, FP32_TOL if dtype == torch.float32 else BF16_MLP_TOL)


def test_bf16_error_is_no_worse_than_native():
    """On a model-sized bf16 GEMV, tpp's error vs fp64 is at most native's (same or better)."""
    dtype = torch.bfloat16
    w, x = rand(1536, 576, seed=5).to(dtype), rand(1, 576, seed=6).to(dtype)
    ref = torch.nn.functional.linear(x.double(), w.double())
    err_tpp = (tpp.linear(x, tpp.prepare_linear(w)).double() - ref).abs().max()
    err_native = (native.linear(x, native.prepare_linear(w)).double() - ref).abs().max()
    assert err_tpp <= err_native * 1.01 + 1e-6


def test_strided_input_and_empty_rows():
    w = rand(70, 40, seed=1)
    x = rand(3, 5, 40, seed=2)[:, -1:]  # non-contiguous, like the lm_head input
    assert not x.is_contiguous()
    assert_close(tpp.linear(x, tpp.prepare_linear(w)), native.linear(x, native.prepare_linear(w)),
                 FP32_TOL)  # fmt: skip
    assert tpp.linear(torch.empty(0, 40), tpp.prepare_linear(w)).shape == (0, 70)


def test_weights_are_packed_once_in_vnni_layout():
    w = rand(100, 70, seed=1).to(torch.bfloat16)
    with mock.patch.dict(os.environ, {"PACE_TPP_BN": "32", "PACE_TPP_BK": "16"}):
        packed = tpp.prepare_linear(w).packed
    assert packed.shape == (4, 5, 8, 32, 2)  # [N/bn][K/bk][bk/2][bn][2], padded 128 x 80
    assert torch.equal(packed[1, 2, 3, 4], w[32 + 4, 2 * 16 + 6 : 2 * 16 + 8])
    assert packed[3, :, :, 4:].abs().sum() == 0 and packed[:, 4, 3:].abs().sum() == 0


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        tpp.prepare_gated_mlp(rand(8, 4, seed=1), rand(8, 4, seed=2), rand(4, 8, seed=3), "swish")
    with mock.patch.dict(os.environ, {"PACE_TPP_BN": "0"}), pytest.raises(ValueError, match="BN"):
        tpp.prepare_linear(rand(8, 4, seed=1))
    with pytest.raises(ValueError, match="x has 5 features"):
        tpp.linear(rand(2, 5, seed=1), tpp.prepare_linear(rand(8, 4, seed=2)))


def test_kernels_release_the_gil():
    """Other Python threads (a server's HTTP thread) run while a kernel does."""
    w = tpp.prepare_linear((torch.randn(8192, 1024) * 0.05).bfloat16(), None)
    x = torch.randn(1024, 1024).bfloat16()
    assert_runs_without_gil(lambda: tpp.linear(x, w))
