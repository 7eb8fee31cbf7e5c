"""Checkpoint reading: safetensors / sharded safetensors / .bin, lazily, with a strict report.

A model builder ``take``s each tensor it needs by name; at the end :meth:`WeightStore.finish`
raises a :class:`ModelLoadError` naming every tensor that was expected but missing, or present
but never used (unless listed as harmless).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from pace_core.errors import ModelLoadError
from pace_core.models.heap import TrimEvery
from pace_core.quant import QuantizedWeight, checkpoint

Weight = torch.Tensor | QuantizedWeight
Loader = Callable[[torch.dtype | None], Weight]
"""Reads one weight; given a dtype, a loader may convert while reading (cheaper than a full
copy of the stored tensor next to the converted one) or return it as stored."""
CONVERT_CHUNK_BYTES = 64 << 20  # stored bytes read at a time when converting while reading

SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"


@dataclass(frozen=True)
class Slice:
    """Part of a tensor along ``dim``: the ``ranges`` (start, stop) concatenated in order, then
    zero rows appended up to ``pad_to`` (a tensor-parallel rank's share of a weight)."""

    dim: int
    ranges: tuple[tuple[int, int], ...]
    pad_to: int | None = None

    @property
    def size(self) -> int:
        return sum(b - a for a, b in self.ranges)


# (tensor name, stored shape) -> the part of it to keep (None: all of it)
SliceRule = Callable[[str, tuple[int, ...]], Slice | None]


def apply_slice(tensor: torch.Tensor, part: Slice) -> torch.Tensor:
    """``part`` of an in-memory tensor (a copy)."""
    pieces = [tensor.narrow(part.dim, a, b - a) for a, b in part.ranges]
    out = torch.cat(pieces, dim=part.dim) if len(pieces) > 1 else pieces[0].contiguous()
    return _pad(out, part)


def _pad(out: torch.Tensor, part: Slice) -> torch.Tensor:
    if part.pad_to is None or part.pad_to == out.shape[part.dim]:
        return out
    shape = list(out.shape)
    shape[part.dim] = part.pad_to - shape[part.dim]
    return torch.cat([out, out.new_zeros(shape)], dim=part.dim)


def _checkpoint_files(directory: Path) -> list[Path]:
    for single, index in (
        ("model.safetensors", SAFETENSORS_INDEX),
        ("pytorch_model.bin", BIN_INDEX),
    ):
        if (directory / index).exists():
            try:
                weight_map = json.loads((directory / index).read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as exc:
                raise ModelLoadError(
                    f"{directory / index} is not a valid shard index: {exc}"
                ) from None
            files = sorted({directory / name for name in weight_map.values()})
            missing = [f.name for f in files if not f.exists()]
            if missing:
                raise ModelLoadError(f"shards listed in {index} are missing: {', '.join(missing)}")
            return files
        if (directory / single).exists():
            return [directory / single]
    found = sorted(p.name for p in directory.iterdir())
    raise ModelLoadError(
        f"no weights in {directory}: expected model.safetensors, {SAFETENSORS_INDEX}, "
        f"pytorch_model.bin or {BIN_INDEX} (found: {', '.join(found) or 'nothing'})"
    )


def _file_loaders(path: Path) -> dict[str, Loader]:
    """A loader per tensor of one checkpoint file; nothing is read until a loader runs."""
    try:
        if path.suffix == ".safetensors":
            header, start = _safetensors_header(path)
            metadata = header.pop("__metadata__", None)
            names = set(header)

            def get(name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
                return _read_safetensor(path, start, header[name], dtype)

            loaders: dict[str, Loader] = {name: partial(get, name) for name in names}
            for name in names:
                loaders[name].read_part = partial(_read_safetensor_part, path, start, header[name])
                loaders[name].shape = tuple(header[name]["shape"])
            for name, info in checkpoint.unpack(metadata).items():
                for part in (f"{name}_scales", f"{name}_mins"):
                    loaders.pop(part, None)
                loaders[name] = partial(_as_stored, partial(checkpoint.assemble, get, name, info,
                                                            names))  # fmt: skip
                loaders[name].shape = tuple(info["shape"])  # the weight's logical shape
            return loaders
        tensors = _load_bin(path)
        loaders = {}
        for name, tensor in tensors.items():
            loaders[name] = partial(_identity, tensor)
            if isinstance(tensor, torch.Tensor):  # mapped or in memory: no read for its shape
                loaders[name].shape = tuple(tensor.shape)
        return loaders
    except Exception as exc:
        raise ModelLoadError(
            f"cannot read weight file {path} ({type(exc).__name__}: {exc}); the file may be "
            "truncated or corrupt — re-download or re-convert it"
        ) from None


def _load_bin(path: Path) -> dict[str, Any]:
    """A ``.bin`` state dict, memory-mapped; a file in torch's legacy (pre-zip) format cannot
    be mapped and is read whole."""
    try:
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as exc:
        if "_use_new_zipfile_serialization" not in str(exc):
            raise
        return torch.load(str(path), map_location="cpu", weights_only=True)


_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip


def _safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a safetensors file and where its data starts."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size < 100_000_000:
            raise ValueError(f"header size {size} is not plausible")
        return json.loads(f.read(size)), 8 + size


def _read_safetensor(
    path: Path, start: int, info: dict[str, Any], dtype: torch.dtype | None = None
) -> torch.Tensor:
    """One tensor read with plain file reads into fresh memory: no mapping of the file stays
    in the process (safetensors' own loader keeps its map, and with it the whole file, in RSS
    until the load ends). Converted to ``dtype`` a chunk of rows at a time when it is a
    float type other than the stored one: the stored tensor never exists whole next to the
    converted one (Gemma 3's fp32 embedding table: 671 MB that a bf16 load never holds)."""
    begin, end = info["data_offsets"]
    stored = _SAFETENSORS_DTYPES.get(info["dtype"])
    if stored is None:
        raise ModelLoadError(f"{path}: tensor dtype {info['dtype']} is not supported")
    shape = info["shape"]
    convert = dtype is not None and dtype != stored and stored.is_floating_point
    if not convert or not shape or end - begin <= CONVERT_CHUNK_BYTES:
        out = torch.empty(end - begin, dtype=torch.uint8)
        with open(path, "rb") as f:
            _read_into(f, start + begin, out, path)
        return out.view(stored).reshape(shape)
    out = torch.empty(shape, dtype=dtype)
    row_bytes = (end - begin) // shape[0]
    rows = max(1, CONVERT_CHUNK_BYTES // max(row_bytes, 1))
    scratch = torch.empty(rows * row_bytes, dtype=torch.uint8)
    with open(path, "rb") as f:
        for first in range(0, shape[0], rows):
            n = min(rows, shape[0] - first)
            chunk = scratch[: n * row_bytes]
            _read_into(f, start + begin + first * row_bytes, chunk, path)
            out[first : first + n].copy_(chunk.view(stored).reshape(n, *shape[1:]))
    return out


def _read_safetensor_part(
    path: Path, start: int, info: dict[str, Any], dtype: torch.dtype | None, part: Slice
) -> torch.Tensor:
    """``part`` of one stored tensor, reading only its bytes along dim 0 (a row range is one
    contiguous run); along another dim, rows are read a chunk at a time and only the part of
    each chunk is kept, so the whole tensor never exists in memory."""
    stored = _SAFETENSORS_DTYPES.get(info["dtype"])
    if stored is None:
        raise ModelLoadError(f"{path}: tensor dtype {info['dtype']} is not supported")
    shape = list(info["shape"])
    begin = info["data_offsets"][0]
    if not shape:
        return _read_safetensor(path, start, info, dtype)
    row_bytes = (info["data_offsets"][1] - begin) // shape[0]
    target = dtype if dtype is not None and stored.is_floating_point else stored
    pieces = []
    with open(path, "rb") as f:
        if part.dim == 0:
            for a, b in part.ranges:
                raw = torch.empty((b - a) * row_bytes, dtype=torch.uint8)
                _read_into(f, start + begin + a * row_bytes, raw, path)
                pieces.append(raw.view(stored).reshape(b - a, *shape[1:]).to(target))
        else:
            rows = max(1, CONVERT_CHUNK_BYTES // max(row_bytes, 1))
            chunks = []
            for first in range(0, shape[0], rows):
                n = min(rows, shape[0] - first)
                raw = torch.empty(n * row_bytes, dtype=torch.uint8)
                _read_into(f, start + begin + first * row_bytes, raw, path)
                t = raw.view(stored).reshape(n, *shape[1:])
                sub = Slice(part.dim, part.ranges)
                chunks.append(apply_slice(t, sub).to(target))
            pieces.append(torch.cat(chunks) if len(chunks) > 1 else chunks[0])
    out = torch.cat(pieces, dim=0) if len(pieces) > 1 else pieces[0]
    return _pad(out, part)


def _read_into(f: Any, offset: int, out: torch.Tensor, path: Path) -> None:
    f.seek(offset)
    if f.readinto(memoryview(out.numpy())) != out.numel():
        raise ModelLoadError(
            f"{path} is truncated or corrupt (its tensor data ends early): re-download or "
            "re-convert it"
        )


def _nbytes(weight: Weight) -> int:
    if isinstance(weight, QuantizedWeight):
        return weight.data.numel() * weight.data.element_size()
    return weight.numel() * weight.element_size()


def _identity(tensor: Weight, dtype: torch.dtype | None = None) -> Weight:
    """A loader of a tensor already in memory (``take`` converts it)."""
    return tensor


def _as_stored(read: Callable[[], Weight], dtype: torch.dtype | None = None) -> Weight:
    """A loader that reads its weight as stored (``take`` converts it)."""
    return read()


class WeightStore:
    """Tensors of a checkpoint, read lazily and handed out once each by name.

    A tensor is read from its (memory-mapped) file when taken and the store keeps no
    reference to it, so a builder that converts each weight before taking the next holds one
    source tensor at a time.
    """

    def __init__(self, loaders: dict[str, Loader], source: str = "") -> None:
        self._loaders = loaders
        self._taken: set[str] = set()
        self.source = source
        self.missing: list[str] = []
        self._progress: Any = None
        self._trim = TrimEvery()
        self._slices: SliceRule | None = None

    def slice_by(self, rule: SliceRule) -> None:
        """Hand out only the part ``rule`` picks of each tensor (a tensor-parallel rank's
        shard): read alone where the file allows (safetensors), else cut after reading.
        A quantized weight is cut along whole quantization groups
        (:func:`slice_quantized`)."""
        self._slices = rule

    def show_progress(self, desc: str = "Loading weights") -> None:
        """A progress bar over the tensors taken, shown once the load has run 2 s."""
        from tqdm.auto import tqdm

        self._progress = tqdm(total=len(self._loaders), desc=desc, unit="tensor", delay=2.0,
                              leave=False)  # fmt: skip

    @classmethod
    def from_tensors(cls, tensors: dict[str, Weight], source: str = "") -> WeightStore:
        return cls({name: partial(_identity, t) for name, t in tensors.items()}, source)

    @classmethod
    def from_dir(cls, directory: str | Path, *, quiet: bool = False) -> WeightStore:
        """Index every checkpoint file of ``directory`` (tensors are read when taken)."""
        directory = Path(directory)
        loaders: dict[str, Loader] = {}
        for path in _checkpoint_files(directory):
            loaders.update(_file_loaders(path))
        return cls(loaders, str(directory))

    def names(self) -> list[str]:
        return list(self._loaders)

    def has(self, name: str) -> bool:
        return name in self._loaders

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The stored shape of every tensor whose file states it without a read (safetensors,
        GGUF, memory-mapped ``.bin``; a quantized weight's logical shape)."""
        return {
            name: tuple(shape)
            for name, loader in self._loaders.items()
            if (shape := getattr(loader, "shape", None)) is not None
        }

    def rename_prefix(self, old: str, new: str = "") -> None:
        """Replace ``old`` by ``new`` at the start of every name (e.g. a multimodal wrapper's);
        a ModelLoadError when a renamed tensor takes a name another already has."""
        renamed: dict[str, Loader] = {}
        for name, loader in self._loaders.items():
            to = new + name[len(old) :] if name.startswith(old) else name
            if to in renamed:
                raise ModelLoadError(
                    f"{self.source}: two tensors are {to!r} once {old!r} is read as {new!r} "
                    "(the checkpoint holds that weight twice, under both names): keep one of "
                    "them, or re-save the checkpoint from its original"
                )
            renamed[to] = loader
        self._loaders = renamed

    def take(self, name: str, dtype: torch.dtype | None = None) -> Any:
        """The tensor called ``name`` (cast to ``dtype``; a quantized weight keeps its format and
        de-quantizes to ``dtype``); records it as missing if absent."""
        loader = self._loaders.get(name)
        if loader is None:
            self.missing.append(name)
            return torch.empty(0)
        self._taken.add(name)
        if self._progress is not None:
            self._progress.update()
        tensor = self._read(name, loader, dtype)
        self._trim.add(_nbytes(tensor))  # the previous weights' transients are free by now
        if dtype is None:
            return tensor
        if isinstance(tensor, QuantizedWeight):
            return tensor.with_dtype(dtype)
        return tensor.to(dtype)

    def _read(self, name: str, loader: Loader, dtype: torch.dtype | None) -> Weight:
        rule = self._slices
        read_part = getattr(loader, "read_part", None)
        if rule is not None and read_part is not None:
            part = rule(name, loader.shape)
            return loader(dtype) if part is None else read_part(dtype, part)
        tensor = loader(dtype)
        if rule is None:
            return tensor
        part = rule(name, tuple(tensor.shape))
        if part is None:
            return tensor
        if isinstance(tensor, QuantizedWeight):
            return slice_quantized(tensor, part, name)
        return apply_slice(tensor, part)

    def take_optional(self, name: str, dtype: torch.dtype | None = None) -> Any:
        return self.take(name, dtype) if name in self._loaders else None

    def discard(self, name: str) -> None:
        """Mark ``name`` as used without reading it (a redundant copy, e.g. of a tied weight)."""
        if name in self._loaders:
            self._taken.add(name)

    def finish(self, ignore: Iterable[str] = (), *, strict: bool = True) -> list[str]:
        """Raise on missing tensors, and on unused ones unless ``strict`` is off.

        ``ignore`` holds regexes of known-harmless extras (e.g. rotary caches). Returns the
        unused names that were tolerated.
        """
        patterns = [re.compile(p) for p in ignore]
        unused = [
            n
            for n in self._loaders
            if n not in self._taken and not any(p.fullmatch(n) for p in patterns)
        ]
        problems = []
        if self.missing:
            problems.append(
                f"missing tensors: {', '.join(self.missing[:20])}"
                + (f" (+{len(self.missing) - 20} more)" if len(self.missing) > 20 else "")
            )
        if unused and strict:
            problems.append(
                f"unexpected tensors: {', '.join(unused[:20])}"
                + (f" (+{len(unused) - 20} more)" if len(unused) > 20 else "")
            )
        if problems:
            raise ModelLoadError(
                f"checkpoint {self.source} does not match the model: {'; '.join(problems)}. "
                "Pass strict=False to LLMModel to tolerate unexpected tensors."
            )
        self._loaders.clear()
        if self._progress is not None:
            self._progress.close()
        return unused


def slice_quantized(weight: QuantizedWeight, part: Slice, name: str = "") -> QuantizedWeight:
    """``part`` of a pace ``int8`` / ``int4`` weight: rows as they are, columns along whole
    quantization groups; ConfigError for a cut inside a group or a GGUF block format."""
    from dataclasses import replace

    from pace_core.errors import ConfigError

    if part.pad_to is not None and part.pad_to != part.size:
        raise ConfigError(f"{name}: a quantized weight cannot be padded to {part.pad_to} rows")
    if part.dim == 0:
        index = torch.cat([torch.arange(a, b) for a, b in part.ranges])
        return weight.rows(index)
    if weight.format not in ("int8", "int4"):
        raise ConfigError(
            f"{name}: tensor parallelism cuts this {weight.format} weight across its input "
            f"columns, which GGUF block formats do not allow; load the float checkpoint (with "
            "quantization= to quantize each rank's shard)"
        )
    group = weight.group_size or weight.shape[1]
    bad = [(a, b) for a, b in part.ranges if a % group or b % group]
    if bad:
        raise ConfigError(
            f"{name}: its {weight.shape[1]} input columns split into parts {bad} that cut "
            f"through its quantization groups of {group}; use a tensor_parallel size whose "
            f"shards are multiples of {group} columns, or quantize on load"
        )
    per = 2 if weight.format == "int4" else 1

    def cut(t: torch.Tensor | None, unit: int) -> torch.Tensor | None:
        if t is None:
            return None
        return torch.cat([t[:, a // unit : b // unit] for a, b in part.ranges], dim=1)

    return replace(
        weight,
        shape=(weight.shape[0], part.size),
        data=cut(weight.data, per),
        scales=cut(weight.scales, group),
        mins=cut(weight.mins, group),
    )
