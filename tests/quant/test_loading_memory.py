"""Loading at the memory floor (slow: fresh processes loading SmolLM2): the tensors the model
keeps are the weights in their format, and RSS stays within the issue's bounds where pace meets
them today (peak RSS of bf16/fp32/GGUF loads is reported by ``pace bench loading``, not held)."""

from __future__ import annotations

import pytest

from pace_core.bench.loading import GB, measure

pytestmark = pytest.mark.slow


PARAMS, TABLE = 134.5e6, 49152 * 576  # SmolLM2: all parameters, the (tied) embedding table
INT8_G32, INT4_G32 = 34 / 32, 20 / 32  # bytes per weight: codes + fp16 scale (+ fp16 min)


@pytest.mark.parametrize("variant", ["int8", "int4"])
def test_quantized_loads_stay_at_the_floor(smollm2_dir, variant):
    m = measure(str(smollm2_dir), variant, "bfloat16")
    matrices = INT8_G32 if variant == "int8" else INT4_G32
    floor = (PARAMS - TABLE) * matrices + TABLE * INT8_G32  # embeddings + head stay 8-bit
    assert m["weights"] <= 1.01 * floor  # the quantized bytes (+ norms), no float copy
    assert m["rss"] <= 1.1 * m["weights"] + 0.6 * GB, m
    assert m["peak"] <= 1.3 * m["weights"] + 0.6 * GB, m


def test_bf16_keeps_one_copy_of_the_tied_table(smollm2_dir):
    m = measure(str(smollm2_dir), None, "bfloat16")
    assert m["weights"] <= 134.5e6 * 2 * 1.005  # 2 bytes per parameter, the tied head shared
    assert m["rss"] <= 1.1 * m["weights"] + 0.6 * GB, m


def test_gguf_load_keeps_the_file_formats():
    from pace_core import zoo

    m = measure(str(zoo.gguf_paths("smollm2")[0]), None, "bfloat16")
    assert m["weights"] <= 100e6  # the Q4_1/Q8_0 blocks as stored (96.6 MB), no float copy
    assert m["rss"] <= 1.1 * m["weights"] + 0.6 * GB, m
