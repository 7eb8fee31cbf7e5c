"""Checkpoint reading: safetensors / sharded safetensors / .bin, lazily, with a strict report.

A model builder ``take``s each tensor it needs by name; at the end :meth:`WeightStore.finish`
raises a :class:`ModelLoadError` naming every tensor that was expected but missing, or present
but never used (unless listed as harmless).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
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
            for name, info in checkpoint.unpack(metadata).items():
                for part in (f"{name}_scales", f"{name}_mins"):
                    loaders.pop(part, None)
                loaders[name] = partial(_as_stored, partial(checkpoint.assemble, get, name, info,
                                                            names))  # fmt: skip
            return loaders
        tensors = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        return {name: partial(_identity, tensor) for name, tensor in tensors.items()}
    except Exception as exc:
        raise ModelLoadError(
            f"cannot read weight file {path} ({type(exc).__name__}: {exc}); the file may be "
            "truncated or corrupt — re-download or re-convert it"
        ) from None


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

    def rename_prefix(self, old: str, new: str = "") -> None:
        """Replace ``old`` by ``new`` at the start of every name (e.g. a multimodal wrapper's)."""
        self._loaders = {
            (new + k[len(old) :] if k.startswith(old) else k): v for k, v in self._loaders.items()
        }

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
        tensor = loader(dtype)
        self._trim.add(_nbytes(tensor))  # the previous weights' transients are free by now
        if dtype is None:
            return tensor
        if isinstance(tensor, QuantizedWeight):
            return tensor.with_dtype(dtype)
        return tensor.to(dtype)

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
