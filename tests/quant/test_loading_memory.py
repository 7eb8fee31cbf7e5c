"""Loading at the memory floor (slow: fresh processes loading real models): the tensors the
model keeps are the weights in their format, and RSS stays within the small models' bounds
(peak <= 1.3 x weights + 0.6 GB, after load <= 1.1 x weights + 0.6 GB; the real-size GGUF
bars against the file are test_gguf_load_memory's). SmolLM2 holds them for the
whole process; Gemma 3's weight load holds them, its tokenizer alone (a 262k-token vocabulary,
parsed by transformers) adds ~0.5 GB of transient memory, reported by ``pace bench loading``."""

from __future__ import annotations

import pytest
from pace_bench.loading import GB, measure

pytestmark = pytest.mark.slow


PARAMS, TABLE = 134.5e6, 49152 * 576  # SmolLM2: all parameters, the (tied) embedding table
INT8_G32, INT4_G32 = 34 / 32, 20 / 32  # bytes per weight: codes + fp16 scale (+ fp16 min)


def within_bounds(m: dict[str, float], peak: str = "peak") -> None:
    assert m["rss"] <= 1.1 * m["weights"] + 0.6 * GB, m
    assert m[peak] <= 1.3 * m["weights"] + 0.6 * GB, m


@pytest.mark.parametrize("variant", ["int8", "int4"])
def test_quantized_loads_stay_at_the_floor(smollm2_dir, variant):
    m = measure(str(smollm2_dir), variant, "bfloat16")
    matrices = INT8_G32 if variant == "int8" else INT4_G32
    floor = (PARAMS - TABLE) * matrices + TABLE * INT8_G32  # embeddings + head stay 8-bit
    assert m["weights"] <= 1.01 * floor  # the quantized bytes (+ norms), no float copy
    within_bounds(m)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_dense_loads_keep_one_copy_of_the_tied_table(smollm2_dir, dtype):
    m = measure(str(smollm2_dir), None, dtype)
    size = 2 if dtype == "bfloat16" else 4
    assert m["weights"] <= PARAMS * size * 1.005  # one copy per parameter, the tied head shared
    within_bounds(m)


def test_gguf_load_keeps_the_file_formats():
    from pace_core import zoo

    m = measure(str(zoo.gguf_paths("smollm2")[0]), None, "bfloat16")
    assert m["weights"] <= 100e6  # the Q4_1/Q8_0 blocks as stored (96.6 MB), no float copy
    within_bounds(m)


@pytest.mark.parametrize(("variant", "dtype"), [(None, "float32"), ("int4", "bfloat16")])
def test_gemma3_weight_load_stays_at_the_floor(gemma3_dir, variant, dtype):
    """Its fp32 embedding table (671 MB) is read a chunk at a time when converted, and packed
    into the tied head before the layers load: never two copies next to the whole model."""
    m = measure(str(gemma3_dir), variant, dtype)
    within_bounds(m, peak="weights_peak")
