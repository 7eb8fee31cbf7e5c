"""Checkpoint reading: safetensors / sharded safetensors / .bin, with a strict report.

A model builder ``take``s each tensor it needs by name; at the end :meth:`WeightStore.finish`
raises a :class:`ModelLoadError` naming every tensor that was expected but missing, or present
but never used (unless listed as harmless).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import torch

from pace_core.errors import ModelLoadError

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


def _read_file(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        return torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot read weight file {path} ({type(exc).__name__}: {exc}); the file may be "
            "truncated or corrupt — re-download or re-convert it"
        ) from None


class WeightStore:
    """Tensors of a checkpoint, handed out once each by name."""

    def __init__(self, tensors: dict[str, torch.Tensor], source: str = "") -> None:
        self._tensors = tensors
        self._taken: set[str] = set()
        self.source = source
        self.missing: list[str] = []

    @classmethod
    def from_dir(cls, directory: str | Path, *, quiet: bool = False) -> WeightStore:
        """Read every checkpoint file of ``directory`` (a progress bar for sharded ones)."""
        from tqdm.auto import tqdm

        directory = Path(directory)
        files = _checkpoint_files(directory)
        tensors: dict[str, torch.Tensor] = {}
        for path in tqdm(
            files, desc="Loading weights", unit="file", disable=quiet or len(files) < 2
        ):
            tensors.update(_read_file(path))
        return cls(tensors, str(directory))

    def names(self) -> list[str]:
        return list(self._tensors)

    def has(self, name: str) -> bool:
        return name in self._tensors

    def rename_prefix(self, old: str, new: str = "") -> None:
        """Replace ``old`` by ``new`` at the start of every name (e.g. a multimodal wrapper's)."""
        self._tensors = {
            (new + k[len(old) :] if k.startswith(old) else k): v for k, v in self._tensors.items()
        }

    def take(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor called ``name`` (cast to ``dtype``); records it as missing if absent."""
        tensor = self._tensors.get(name)
        if tensor is None:
            self.missing.append(name)
            return torch.empty(0)
        self._taken.add(name)
        return tensor if dtype is None else tensor.to(dtype)

    def take_optional(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        return self.take(name, dtype) if name in self._tensors else None

    def finish(self, ignore: Iterable[str] = (), *, strict: bool = True) -> list[str]:
        """Raise on missing tensors, and on unused ones unless ``strict`` is off.

        ``ignore`` holds regexes of known-harmless extras (e.g. rotary caches). Returns the
        unused names that were tolerated.
        """
        patterns = [re.compile(p) for p in ignore]
        unused = [
            n
            for n in self._tensors
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
        self._tensors.clear()
        return unused
