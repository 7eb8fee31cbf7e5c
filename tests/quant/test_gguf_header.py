"""pace's GGUF header reader against the ``gguf`` package's reader on files written by its
writer: every scalar and string, arrays stepped over, the tensor directory and its bytes."""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from pace_core.errors import ModelLoadError
from pace_core.models.gguf_header import GGUFHeader

SCALARS = {
    "t.u8": (np.uint8(7), gguf.GGUFValueType.UINT8),
    "t.i8": (np.int8(-7), gguf.GGUFValueType.INT8),
    "t.u16": (np.uint16(700), gguf.GGUFValueType.UINT16),
    "t.i16": (np.int16(-700), gguf.GGUFValueType.INT16),
    "t.u32": (np.uint32(70000), gguf.GGUFValueType.UINT32),
    "t.i32": (np.int32(-70000), gguf.GGUFValueType.INT32),
    "t.f32": (np.float32(0.25), gguf.GGUFValueType.FLOAT32),
    "t.u64": (np.uint64(1 << 40), gguf.GGUFValueType.UINT64),
    "t.i64": (np.int64(-(1 << 40)), gguf.GGUFValueType.INT64),
    "t.f64": (np.float64(1e-300), gguf.GGUFValueType.FLOAT64),
}


def write(path: Path, alignment: int | None = None) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    for key, (value, kind) in SCALARS.items():
        w.add_key_value(key, value, kind)
    w.add_bool("t.bool", True)
    w.add_string("t.text", "héllo ✓")
    w.add_array("t.words", ["a", "bb", "", "dddd"] * 50)  # strings: skipped by length
    w.add_array("t.ints", list(range(300)))
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_uint32("t.after_arrays", 42)  # read correctly only if the arrays were skipped right
    w.add_tensor("a.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("b.weight", np.arange(6, dtype=np.float16).reshape(2, 3))
    q8 = np.random.default_rng(0).integers(0, 255, (2, 34 * 2), dtype=np.uint8)
    w.add_tensor("c.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)  # [2, 64]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_header_matches_the_gguf_reader(tmp_path, alignment):
    path = write(tmp_path / "t.gguf", alignment)
    header, reference = GGUFHeader(path), gguf.GGUFReader(str(path))
    for key, (value, _) in SCALARS.items():
        assert header.metadata[key] == value.item(), key
    assert header.metadata["t.bool"] is True
    assert header.metadata["t.text"] == "héllo ✓"
    assert header.metadata["t.after_arrays"] == 42
    assert header.metadata["general.architecture"] == "llama"
    assert not {"t.words", "t.ints", "t.nested"} & set(header.metadata)  # arrays not decoded
    assert [t.name for t in header.tensors] == [t.name for t in reference.tensors]
    for mine, ref in zip(header.tensors, reference.tensors, strict=True):
        assert mine.shape == tuple(int(d) for d in reversed(ref.shape.tolist()))
        assert mine.ggml_type == int(ref.tensor_type)
        assert mine.offset == ref.data_offset
        assert mine.nbytes == ref.n_bytes
        assert torch.equal(header.data(mine), torch.from_numpy(ref.data.view(np.uint8).ravel()))
    assert header.tensors[2].type_name == "Q8_0"


def test_views_stay_valid_after_release(tmp_path):
    header = GGUFHeader(write(tmp_path / "t.gguf"))
    a = header.data(header.tensors[0]).view(torch.float32)
    header.release_pages()
    assert torch.equal(a, torch.arange(12, dtype=torch.float32))


@pytest.mark.parametrize(
    ("cut", "why"),
    [(0, "it is empty"), (3, "no GGUF magic"), (20, "the header runs past the end"),
     (40, "the header runs past the end"), (None, "tensor c.weight ends past the end")],
)  # fmt: skip
def test_truncated_header_or_data(tmp_path, cut, why):
    path = write(tmp_path / "t.gguf")
    short = tmp_path / "short.gguf"
    shutil.copy(path, short)
    with open(short, "r+b") as f:  # None: in the middle of the last tensor's bytes
        f.truncate(GGUFHeader(path).tensors[-1].offset + 10 if cut is None else cut)
    with pytest.raises(ModelLoadError, match=rf"short\.gguf \({why}.*truncated or corrupt"):
        GGUFHeader(short)


def test_unknown_version(tmp_path):
    path = write(tmp_path / "t.gguf")
    data = bytearray(path.read_bytes())
    data[4:8] = (1).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"GGUF version 1 .*pace reads v2/v3"):
        GGUFHeader(path)


def _with_header(path: Path, build) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    build(w)
    w.add_tensor("a.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_zero_alignment_is_named(tmp_path):
    path = _with_header(tmp_path / "t.gguf", lambda w: w.add_uint32("general.alignment", 0))
    with pytest.raises(ModelLoadError, match=r"general.alignment is 0; it must be at least 1"):
        GGUFHeader(path)


def test_arrays_nested_past_the_limit_are_named(tmp_path):
    """Arrays nested past 64 (a crafted file 5,000 deep gave a RecursionError): a clear
    error; 60 deep reads."""

    def nested(depth: int) -> list:
        value: list = [1]
        for _ in range(depth):
            value = [value]
        return value

    GGUFHeader(_with_header(tmp_path / "ok.gguf", lambda w: w.add_array("t.deep", nested(60))))
    path = _with_header(tmp_path / "deep.gguf", lambda w: w.add_array("t.deep", nested(100)))
    with pytest.raises(ModelLoadError, match=r"deep\.gguf \(metadata arrays nested deeper"):
        GGUFHeader(path)
