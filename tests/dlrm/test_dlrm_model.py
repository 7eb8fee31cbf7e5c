"""The DLRM model against the plain-torch reference of the same weights: fp32 equal within
tolerance, bf16 close, int8 by log loss / AUC / probabilities on teacher-labelled synthetic
clicks; its op plan, fallbacks, files and input errors."""

from __future__ import annotations

import pytest
import torch
from support.isa import needs_avx512_int8

from pace_core.dlrm import (
    DLRM,
    DLRMConfig,
    DLRMInputError,
    ReferenceDLRM,
    SyntheticClicks,
    auc,
    logloss,
)
from pace_core.dlrm.features import check_dense, fixed_hotness
from pace_core.dlrm.weights import random_state
from pace_core.errors import ConfigError, ModelLoadError, OpResolutionError

CONFIG = DLRMConfig.tiny()
OPS = ("linear", "embedding_bag", "cross_interaction")
AVX512 = {**dict.fromkeys(OPS, "avx512"), "default": "native", "strict": True}
# int8 on the tiny model, 8192 teacher-labelled samples (measured: logloss +0.0003, AUC
# -0.0005, largest probability difference 0.06 at embedding dim 32)
INT8_LOGLOSS, INT8_AUC, INT8_PROB = 1e-3, 2e-3, 0.1


@pytest.fixture(scope="module")
def state():
    return random_state(CONFIG, seed=0)


@pytest.fixture(scope="module")
def clicks(state):
    return SyntheticClicks(CONFIG, state, seed=0).batch(8192)


def reference_logits(state, batch) -> torch.Tensor:
    with torch.no_grad():
        return ReferenceDLRM(CONFIG, state)(batch.dense, *fixed_hotness(batch.sparse))


PLANS = [pytest.param({"default": "native"}, id="native"),
         pytest.param(AVX512, id="avx512", marks=needs_avx512_int8)]  # fmt: skip


@pytest.mark.parametrize("opconfig", PLANS)
def test_fp32_equals_the_reference(state, clicks, opconfig):
    model = DLRM(CONFIG, state, opconfig=opconfig)
    backend = "native" if opconfig.get("default") == "native" and "linear" not in opconfig else (
        "avx512")  # fmt: skip
    assert model.op_plan.backends() == {op: {backend} for op in OPS}
    ref = reference_logits(state, clicks)
    out = model.logits(clicks.dense, clicks.sparse)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("opconfig", PLANS)
def test_bf16_is_close_to_fp32(state, clicks, opconfig):
    model = DLRM(CONFIG, state, dtype=torch.bfloat16, opconfig=opconfig)
    probs = model.predict(clicks.dense, clicks.sparse)
    ref = torch.sigmoid(reference_logits(state, clicks))
    assert (probs - ref).abs().max() < 0.05
    assert abs(logloss(probs, clicks.labels) - logloss(ref, clicks.labels)) < 1e-3


@pytest.mark.parametrize("opconfig", PLANS)
def test_int8_keeps_logloss_within_0001_of_fp32(state, clicks, opconfig):
    model = DLRM(CONFIG, state, quantization="int8", opconfig=opconfig)
    assert {s.kernel.weight_formats >= {"int8"} for s in model.op_plan.named.values()} == {True}
    probs = model.predict(clicks.dense, clicks.sparse)
    ref = torch.sigmoid(reference_logits(state, clicks))
    d_logloss = logloss(probs, clicks.labels) - logloss(ref, clicks.labels)
    d_auc = auc(probs, clicks.labels) - auc(ref, clicks.labels)
    d_prob = float((probs - ref).abs().max())
    assert abs(d_logloss) < INT8_LOGLOSS, d_logloss
    assert abs(d_auc) < INT8_AUC, d_auc
    assert 0 < d_prob < INT8_PROB, d_prob  # quantized (not the fp32 model), but close


@needs_avx512_int8
def test_avx512_int8_agrees_with_native_int8(state, clicks):
    ours = DLRM(CONFIG, state, quantization="int8", opconfig=AVX512)
    ref = DLRM(CONFIG, state, quantization="int8", opconfig={"default": "native"})
    a = ours.logits(clicks.dense[:512], [t[:512] for t in clicks.sparse])
    b = ref.logits(clicks.dense[:512], [t[:512] for t in clicks.sparse])
    # Same quantization rule on both; fp32 sums in another order can move an activation
    # across a rounding boundary (one int8 step), which the next layers carry on: a few rows
    # differ by such a step, the rest agree to fp32 accuracy.
    diff = (a - b).abs()
    assert float((diff < 1e-3).float().mean()) > 0.98
    assert float(diff.max()) < 0.2


def test_without_avx2_every_site_falls_back_with_the_reason(state, clean_env):
    clean_env.setenv("PACE_CPU_FEATURES_DISABLE", "avx2,avx512f")
    model = DLRM(CONFIG, state, opconfig={"cross_interaction": "avx512",
                                          "embedding_bag": "avx512"})  # fmt: skip
    cross = model.op_plan.named["cross"]
    assert cross.backend == "native"
    assert cross.fallback_reason.startswith("missing CPU features:")
    assert "avx2" in cross.fallback_reason and cross.fallback_reason in str(model.op_plan)
    with pytest.raises(OpResolutionError, match="pinned backend 'avx512' unavailable"):
        DLRM(CONFIG, state, opconfig={"cross_interaction": "avx512", "strict": True})


def test_predictions_survive_save_and_load(state, clicks, tmp_path):
    model = DLRM(CONFIG, state, quantization="int8")
    path = model.save(tmp_path / "dlrm.pt")
    again = DLRM.load(path, quantization="int8")
    assert again.config == CONFIG
    x, s = clicks.dense[:64], [t[:64] for t in clicks.sparse]
    assert torch.equal(model.predict(x, s), again.predict(x, s))


def test_a_torchrec_state_dict_with_the_mlperf_prefix_loads(state, clicks, tmp_path):
    torch.save({f"model.{k}": v for k, v in state.items()}, tmp_path / "torchrec.pt")
    model = DLRM.load(tmp_path / "torchrec.pt")
    assert model.config.table_rows == CONFIG.table_rows
    assert model.config.cross_rank == CONFIG.cross_rank
    ref = reference_logits(state, clicks)
    torch.testing.assert_close(model.logits(clicks.dense, clicks.sparse), ref, atol=1e-4,
                               rtol=1e-4)  # fmt: skip
    # a broken file names the tensor
    broken = {
        k: v for k, v in torch.load(tmp_path / "torchrec.pt").items() if "V_kernels.1" not in k
    }
    torch.save(broken, tmp_path / "broken.pt")
    with pytest.raises(ModelLoadError, match="misshapen|missing"):
        DLRM.load(tmp_path / "broken.pt", config=CONFIG)


def test_ragged_bags_give_the_same_result_as_fixed_hotness(state, clicks):
    model = DLRM(CONFIG, state)
    x, s = clicks.dense[:16], [t[:16] for t in clicks.sparse]
    indices, offsets = fixed_hotness(s)
    ragged = list(zip(indices, offsets, strict=True))
    assert torch.equal(model.logits(x, s), model.logits(x, ragged))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d, s: (d, s[:-1]), r"got 3 sparse features; this model has 4 tables"),
        (lambda d, s: (d[:, :12], s), r"shape \(4, 12\); this model takes \[batch, 13\]"),
        (lambda d, s: (d.long(), s), r"dtype int64; they must be floating point"),
        (lambda d, s: (d, [s[0].float(), *s[1:]]), r"sparse feature 0 has dtype float32"),
        (
            lambda d, s: (d, [s[0], s[1] + 37, *s[2:]]),
            r"feature 1 has id \d+, outside its table's 37",
        ),
        (lambda d, s: (d, [s[0], s[1], s[2] - 1000, s[3]]), r"sparse feature 2 has id -"),
        (lambda d, s: (d, [s[0][:3], *s[1:]]), r"sparse feature 0 has shape \(3, 3\)"),
        (
            lambda d, s: (d.index_fill(0, torch.tensor([2]), float("inf")), s),
            r"dense features of 1 sample\(s\) hold NaN or infinite values \(rows 2\)",
        ),
    ],
)
def test_bad_inputs_name_the_value_and_the_fix(state, clicks, change, message):
    model = DLRM(CONFIG, state, opconfig={"default": "native"})
    dense, sparse = change(clicks.dense[:4], [t[:4] for t in clicks.sparse])
    with pytest.raises(DLRMInputError, match=message):
        model.predict(dense, sparse)


@needs_avx512_int8
def test_avx512_out_of_range_id_is_reported_like_native(state, clicks):
    model = DLRM(CONFIG, state, opconfig=AVX512)
    sparse = [t[:4] for t in clicks.sparse]
    sparse[3] = sparse[3] + 3
    with pytest.raises(
        DLRMInputError, match="sparse feature 3 has id [3-5], outside its table's 3"
    ):
        model.predict(clicks.dense[:4], sparse)


def test_synthetic_clicks_are_deterministic_and_labelled_by_the_teacher(state):
    a = SyntheticClicks(CONFIG, state, seed=3).batch(2000)
    b = SyntheticClicks(CONFIG, state, seed=3).batch(2000)
    c = SyntheticClicks(CONFIG, state, seed=4).batch(2000)
    assert torch.equal(a.labels, b.labels) and torch.equal(a.sparse[2], b.sparse[2])
    assert not torch.equal(a.sparse[2], c.sparse[2])
    assert 0.1 < float(a.labels.mean()) < 0.45  # calibrated click rate (~25%)
    assert auc(a.probs, a.labels) > 0.7  # the teacher's probabilities carry the signal
    for t, rows in zip(a.sparse, CONFIG.table_rows, strict=True):
        assert int(t.min()) >= 0 and int(t.max()) < rows


def test_auc_matches_the_pairwise_definition():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 5, (60,), generator=gen).float()  # many ties
    labels = (torch.rand(60, generator=gen) < 0.4).float()
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = (pos[:, None] > neg[None, :]).double() + 0.5 * (pos[:, None] == neg[None, :]).double()
    assert auc(scores, labels) == pytest.approx(float(pairs.mean()), abs=1e-12)
    half = logloss(torch.tensor([0.5, 0.5]), torch.tensor([0.0, 1.0]))
    assert half == pytest.approx(0.693147, abs=1e-6)


def test_config_and_quantization_errors():
    with pytest.raises(ConfigError, match="bottom MLP must end at embedding_dim"):
        DLRMConfig(bottom_mlp=(512, 64))
    with pytest.raises(ConfigError, match="choose one of none, fp, int8"):
        DLRM(CONFIG, random_state(CONFIG), quantization="int4")
    assert DLRMConfig.scaled().interaction_dim == 27 * 128
    assert max(DLRMConfig.scaled().table_rows) == 100_000
    assert sum(DLRMConfig.mlperf().table_rows) == 204_184_588


def test_many_non_finite_samples_are_counted_and_the_first_named():
    dense = torch.zeros(12, CONFIG.dense_features)
    dense[2:12, 5] = float("-inf")
    with pytest.raises(DLRMInputError, match=r"of 10 sample\(s\) .* \(rows 2, 3, 4, 5, 6, 7, 8, 9, "
                                             r"\.\.\.\)"):  # fmt: skip
        check_dense(dense, CONFIG)
