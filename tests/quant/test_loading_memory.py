"""Loading at the memory floor (slow: fresh processes loading SmolLM2): the tensors the model
keeps are the weights in their format, and RSS stays within the issue's bounds where pace meets
them today (peak RSS of bf16/fp32/GGUF loads is reported by ``pace bench loading``, not held)."""

from __future__ import annotations

import pytest

from pace_core.bench.loading import GB, measure

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("variant", "bits"), [("int8", 8.5), ("int4", 5.0)])
def test_quantized_loads_stay_at_the_floor(smollm2_dir, variant, bits):
    m = measure(str(smollm2_dir), variant, "bfloat16")
    params = 134.5e6
    assert m["weights"] <= params * (bits + 0.6) / 8  # codes + fp16 scales (+ mins), no float copy
    assert m["rss"] <= 1.1 * m["weights"] + 0.6 * GB
    assert m["peak"] <= 1.3 * m["weights"] + 0.6 * GB


def test_bf16_keeps_one_copy_of_the_tied_table(smollm2_dir):
    m = measure(str(smollm2_dir), None, "bfloat16")
    assert m["weights"] <= 134.5e6 * 2 * 1.005  # 2 bytes per parameter, the tied head shared
    assert m["rss"] <= 1.1 * m["weights"] + 0.6 * GB


def test_gguf_load_keeps_the_file_formats():
    from pace_core import zoo

    m = measure(str(zoo.gguf_paths("smollm2")[0]), None, "bfloat16")
    assert m["weights"] <= 100e6  # the Q4_1/Q8_0 blocks as stored (96.6 MB), no float copy
    assert m["rss"] <= 1.1 * m["weights"] + 0.6 * GB
