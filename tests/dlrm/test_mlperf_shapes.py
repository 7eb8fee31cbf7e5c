"""The scaled MLPerf DLRMv2 (real layer shapes, tables capped at 20k rows): int8 against fp32
on teacher-labelled synthetic clicks. Slow (builds ~0.4 GB of tables): `make test-slow`."""

from __future__ import annotations

import pytest
import torch
from support.isa import needs_avx512_int8

from pace_core.dlrm import DLRM, DLRMConfig, SyntheticClicks, auc, logloss
from pace_core.dlrm.weights import random_state

pytestmark = pytest.mark.slow


@needs_avx512_int8
def test_scaled_mlperf_int8_and_bf16_against_fp32():
    config = DLRMConfig.scaled(20_000)
    state = random_state(config, seed=0)
    batch = SyntheticClicks(config, state, seed=1).batch(16384)
    fp32 = DLRM(config, state)
    probs = {}
    for name, model in (("fp32", fp32), ("bf16", DLRM(config, state, dtype=torch.bfloat16)),
                        ("int8", DLRM(config, state, quantization="int8"))):  # fmt: skip
        probs[name] = torch.cat([model.predict(batch.dense[s : s + 2048],
                                               [t[s : s + 2048] for t in batch.sparse])
                                 for s in range(0, batch.size, 2048)])  # fmt: skip
    torch.testing.assert_close(probs["fp32"], batch.probs, atol=1e-4, rtol=1e-3)  # the teacher
    base = logloss(probs["fp32"], batch.labels)
    assert abs(logloss(probs["int8"], batch.labels) - base) < 1e-3
    assert abs(auc(probs["int8"], batch.labels) - auc(probs["fp32"], batch.labels)) < 2e-3
    assert float((probs["int8"] - probs["fp32"]).abs().max()) < 0.1
    assert abs(logloss(probs["bf16"], batch.labels) - base) < 1e-3
