"""DLRM int8 with calibrated (static) activation scales: the calibration pass, both kernels
honouring the scales alike (and clamping past them), and the quality against fp32."""

from __future__ import annotations

import pytest
import torch
from support.isa import needs_avx512_int8

from pace_core.dlrm import DLRM, DLRMConfig, DLRMQuantization, SyntheticClicks, auc, logloss, names
from pace_core.dlrm.calibrate import activation_scales
from pace_core.dlrm.weights import random_state
from pace_core.errors import ConfigError
from pace_core.quant import QuantizationConfig, quantize

CONFIG = DLRMConfig.tiny()
NATIVE = {"default": "native"}
OPS = ("linear", "embedding_bag", "cross_interaction")
AVX512 = {**dict.fromkeys(OPS, "avx512"), "default": "native", "strict": True}


@pytest.fixture(scope="module")
def state():
    return random_state(CONFIG, seed=0)


@pytest.fixture(scope="module")
def clicks(state):
    return SyntheticClicks(CONFIG, state, seed=0).batch(8192)


@pytest.fixture(scope="module")
def calibration():
    data = SyntheticClicks(CONFIG, seed=5)
    gen = torch.Generator().manual_seed(5)
    return [data.features(1024, gen) for _ in range(2)]


def test_calibration_scales_every_int8_matrix(state, calibration):
    scales = activation_scales(CONFIG, state, calibration)
    expected = {f"{m}.weight" for m in names.bottom(CONFIG)[1:] + names.top(CONFIG)}
    expected |= {n for v, u, _ in names.cross(CONFIG) for n in (v, u)}
    assert set(scales) == expected  # the first bottom layer (13 inputs) stays float
    for name, s in scales.items():
        assert s.dtype == torch.float32 and s.shape == (state[name].shape[1] // 32,)
        assert bool((s >= 0).all())


def test_static_needs_calibration(state):
    with pytest.raises(ConfigError, match="calibration"):
        DLRM(CONFIG, state, quantization="int8-static")


PLANS = [pytest.param(NATIVE, id="native"),
         pytest.param(AVX512, id="avx512", marks=needs_avx512_int8)]  # fmt: skip


@pytest.mark.parametrize("opconfig", PLANS)
def test_static_int8_keeps_logloss_within_0001_of_fp32(state, clicks, calibration, opconfig):
    fp32 = DLRM(CONFIG, state, opconfig=NATIVE).predict(clicks.dense, clicks.sparse)
    model = DLRM(CONFIG, state, quantization="int8-static", calibration=calibration,
                 opconfig=opconfig)  # fmt: skip
    assert model.quantization.activations == "static" and model.quantization.scales
    probs = model.predict(clicks.dense, clicks.sparse)
    d_logloss = logloss(probs, clicks.labels) - logloss(fp32, clicks.labels)
    d_auc = auc(probs, clicks.labels) - auc(fp32, clicks.labels)
    assert abs(d_logloss) < 1e-3, d_logloss
    assert abs(d_auc) < 2e-3, d_auc
    dynamic = DLRM(CONFIG, state, quantization="int8", opconfig=opconfig)
    assert not torch.equal(probs, dynamic.predict(clicks.dense, clicks.sparse))  # other scales


def _static_weight(n: int, k: int, scales: torch.Tensor):
    from dataclasses import replace

    w = torch.randn(n, k, generator=torch.Generator().manual_seed(3))
    q = quantize(w, QuantizationConfig(bits=8))
    return replace(q, activations="int8", activation_scales=scales)


@needs_avx512_int8
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_avx512_static_scales_match_native_and_clamp(dtype):
    """Both kernels quantize with the given scales (not the rows' own), clamping values past
    them to +-127: the same codes, so the outputs agree to accumulation order."""
    import pace_native.kernels as native
    from pace_avx512 import kernels as avx
    from pace_avx512 import packing

    k = 96
    scales = torch.full((k // 32,), 0.01)  # a range of +-1.27: most of randn * 2 clamps
    w = _static_weight(48, k, scales).with_dtype(dtype)
    x = (torch.randn(5, k, generator=torch.Generator().manual_seed(4)) * 2).to(dtype)
    ours = avx.linear(x, packing.prepare_linear(w))
    ref = native.linear(x, native.prepare_linear(w))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours.float(), ref.float(), atol=tol * ref.abs().max().item(),
                               rtol=tol)  # fmt: skip
    # the clamp: x and x clipped to the calibrated range give the same result
    clipped = native.linear(x.float().clamp(-1.27, 1.27).to(dtype), native.prepare_linear(w))
    torch.testing.assert_close(ref, clipped)


def test_quantization_with_scales_is_reused(state, calibration):
    scales = activation_scales(CONFIG, state, calibration)
    q = DLRMQuantization().calibrated(scales)
    a = DLRM(CONFIG, state, quantization=q, opconfig=NATIVE)
    b = DLRM(CONFIG, state, quantization="int8-static", calibration=calibration,
             opconfig=NATIVE)  # fmt: skip
    batch = SyntheticClicks(CONFIG, seed=9).batch(64)
    torch.testing.assert_close(a.logits(batch.dense, batch.sparse),
                               b.logits(batch.dense, batch.sparse))  # fmt: skip
