"""A GGUF file's header, read without materializing its vocabulary: the metadata scalars and
the tensor directory; each tensor's bytes read on their own (:meth:`GGUFHeader.read`) or as a
view of one copy-on-write memory map (:meth:`GGUFHeader.data`).

The ``gguf`` package's reader turns every metadata field into numpy objects, the tokenizer's
arrays of ~50k strings included: ~170 MB and ~4 s for a small model's file. pace takes its
config and tokenizer from transformers' conversion (cached once per file), so it needs only a
few scalars here; arrays are stepped over, never decoded.

Layout (GGUF v2/v3, little-endian): magic ``GGUF``, version u32, tensor count u64, metadata
count u64; metadata entries (key string, value type u32, value); tensor infos (name string,
n_dims u32, dims u64 each, ggml type u32, offset u64 from the data start); padding to
``general.alignment`` (default 32); tensor data.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from pace_core.errors import ModelLoadError
from pace_core.quant.gguf_blocks import BY_GGML_TYPE

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ARRAY_NESTING = 64  # arrays of arrays: deeper is no real file (and would exhaust the stack)

_STRING, _ARRAY = 8, 9
_SCALARS: dict[int, str] = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
    10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
"""GGUF value type -> struct format of a scalar (8 = string and 9 = array are read apart)."""

Scalar = int | float | bool | str


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the directory: ``shape`` as torch orders it (slowest dim first)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the file

    @property
    def type_name(self) -> str:
        """The ggml type's name (``Q4_K``, ...), for messages."""
        known = BY_GGML_TYPE.get(self.ggml_type)
        if known is not None:
            return known.name.upper()
        try:
            from gguf import GGMLQuantizationType

            return GGMLQuantizationType(self.ggml_type).name
        except (ImportError, ValueError):
            return f"ggml type {self.ggml_type}"

    @property
    def nbytes(self) -> int:
        """Stored bytes (the type must be one pace reads)."""
        kind = BY_GGML_TYPE[self.ggml_type]
        return math.prod(self.shape) // kind.block_elems * kind.block_bytes


class _Cursor:
    """Sequential little-endian reads from the map; running off its end is a truncated file."""

    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer, self.pos = buffer, 0

    def unpack(self, fmt: str) -> Scalar:
        try:
            (value,) = struct.unpack_from(fmt, self.buffer, self.pos)
        except struct.error:
            raise ValueError("the header runs past the end of the file") from None
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = int(self.unpack("<Q"))
        end = self.pos + size
        if end > len(self.buffer):
            raise ValueError("the header runs past the end of the file")
        text = self.buffer[self.pos : end].decode("utf-8", errors="replace")
        self.pos = end
        return text

    def value(self, kind: int, depth: int = 0) -> Scalar | None:
        """A scalar or string value; an array is skipped (None). ``depth``: the arrays this
        value sits in."""
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            if depth >= MAX_ARRAY_NESTING:
                raise ValueError(f"metadata arrays nested deeper than {MAX_ARRAY_NESTING}")
            self.skip_array(depth + 1)
            return None
        if kind not in _SCALARS:
            raise ValueError(f"unknown metadata value type {kind}")
        return self.unpack(_SCALARS[kind])

    def skip_array(self, depth: int = 1) -> None:
        kind, count = int(self.unpack("<I")), int(self.unpack("<Q"))
        if kind in _SCALARS:
            self.pos += count * struct.calcsize(_SCALARS[kind])
            return
        for _ in range(count):  # strings and nested arrays have their own lengths
            if kind == _STRING:
                size = int(self.unpack("<Q"))  # read before pos is (``pos += f()`` reads pos first)
                self.pos += size
            else:
                self.value(kind, depth)


class GGUFHeader:
    """The parsed header of ``path`` and a private copy-on-write map of the whole file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:
            try:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            except ValueError:  # an empty file cannot be mapped
                raise self._corrupt("it is empty") from None
        try:
            self.metadata, self.tensors = self._parse(_Cursor(self._map))
        except ValueError as exc:
            raise self._corrupt(str(exc)) from None

    def _corrupt(self, why: str) -> ModelLoadError:
        return ModelLoadError(
            f"cannot read GGUF file {self.path} ({why}); it may be truncated or corrupt — "
            "re-download it"
        )

    def _parse(self, c: _Cursor) -> tuple[dict[str, Scalar], list[TensorInfo]]:
        if bytes(self._map[:4]) != MAGIC:
            raise ValueError("no GGUF magic at its start")
        c.pos = 4
        version = int(c.unpack("<I"))
        if version not in VERSIONS:
            raise ValueError(f"GGUF version {version} (big-endian or unknown); pace reads v2/v3")
        n_tensors, n_fields = int(c.unpack("<Q")), int(c.unpack("<Q"))
        metadata: dict[str, Scalar] = {}
        for _ in range(n_fields):
            key = c.string()
            value = c.value(int(c.unpack("<I")))
            if value is not None:
                metadata[key] = value
        infos = []
        for _ in range(n_tensors):
            name = c.string()
            dims = [int(c.unpack("<Q")) for _ in range(int(c.unpack("<I")))]
            infos.append((name, tuple(reversed(dims)), int(c.unpack("<I")), int(c.unpack("<Q"))))
        align = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if align < 1:
            raise ValueError(f"general.alignment is {align}; it must be at least 1")
        start = -(-c.pos // align) * align
        tensors = [TensorInfo(n, s, t, start + off) for n, s, t, off in infos]
        for t in tensors:
            if t.ggml_type in BY_GGML_TYPE and t.offset + t.nbytes > len(self._map):
                raise ValueError(f"tensor {t.name} ends past the end of the file")
        return metadata, tensors

    def data(self, tensor: TensorInfo) -> torch.Tensor:
        """``tensor``'s bytes as a ``uint8`` view of the map (nothing is read until used)."""
        return torch.frombuffer(self._map, dtype=torch.uint8, count=tensor.nbytes,
                                offset=tensor.offset)  # fmt: skip

    def read(self, tensor: TensorInfo) -> torch.Tensor:
        """``tensor``'s bytes read into fresh memory (``uint8``), the map left untouched.

        What a load takes: a kernel that repacks a weight frees it with the weight, so the
        file's bytes are in memory one tensor at a time. Pages of the map stay resident
        until :meth:`release_pages`: views of it would hold the whole file next to the
        repacked copies until the model is built (peak ~2x the file)."""
        out = torch.empty(tensor.nbytes, dtype=torch.uint8)
        with open(self.path, "rb") as f:
            f.seek(tensor.offset)
            if f.readinto(memoryview(out.numpy())) != tensor.nbytes:
                raise self._corrupt(f"tensor {tensor.name} ends past the end of the file")
        return out

    def release_pages(self) -> None:
        """Drop the map's resident pages (clean, private: views fault them back when read)."""
        if hasattr(self._map, "madvise"):
            self._map.madvise(mmap.MADV_DONTNEED)
