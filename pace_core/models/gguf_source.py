"""GGUF files as a model source: config and tokenizer from the metadata (as transformers reads
them), tensors kept in their GGUF formats (read one at a time when taken, never expanded to
floats).

Tensor names are mapped to the Hugging Face names the family builders take; the two
transformations llama.cpp's converter applies are undone on the stored rows: the Q/K row
permutation of ``llama`` and the ``+ 1`` folded into Gemma norm weights.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from pace_core.errors import ModelLoadError
from pace_core.models.gguf_header import GGUFHeader, TensorInfo
from pace_core.models.weights import Loader, WeightStore
from pace_core.quant import QuantizedWeight
from pace_core.quant.gguf_blocks import BY_GGML_TYPE

SUFFIX = ".gguf"

_COMMON = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "blk.{i}.attn_norm": "model.layers.{i}.input_layernorm",
    "blk.{i}.attn_q": "model.layers.{i}.self_attn.q_proj",
    "blk.{i}.attn_k": "model.layers.{i}.self_attn.k_proj",
    "blk.{i}.attn_v": "model.layers.{i}.self_attn.v_proj",
    "blk.{i}.attn_output": "model.layers.{i}.self_attn.o_proj",
    "blk.{i}.ffn_gate": "model.layers.{i}.mlp.gate_proj",
    "blk.{i}.ffn_up": "model.layers.{i}.mlp.up_proj",
    "blk.{i}.ffn_down": "model.layers.{i}.mlp.down_proj",
}
_PRE_NORM = {"blk.{i}.ffn_norm": "model.layers.{i}.post_attention_layernorm"}
_GEMMA3 = {
    "blk.{i}.attn_q_norm": "model.layers.{i}.self_attn.q_norm",
    "blk.{i}.attn_k_norm": "model.layers.{i}.self_attn.k_norm",
    "blk.{i}.post_attention_norm": "model.layers.{i}.post_attention_layernorm",
    "blk.{i}.ffn_norm": "model.layers.{i}.pre_feedforward_layernorm",
    "blk.{i}.post_ffw_norm": "model.layers.{i}.post_feedforward_layernorm",
}
MODULE_NAMES: dict[str, dict[str, str]] = {
    "llama": _COMMON | _PRE_NORM,
    "qwen2": _COMMON | _PRE_NORM,
    "gemma3": _COMMON | _GEMMA3,
}
"""GGUF module names -> Hugging Face module names, per GGUF ``general.architecture``."""
HARMLESS = ("rope_freqs.weight",)  # llama 3 rope factors: pace computes them from the config


def find_gguf(path: Path) -> Path | None:
    """The GGUF file ``path`` names: the file itself, or the one ``*.gguf`` of a directory
    without a config.json. None when ``path`` is no GGUF model."""
    if path.is_file():
        return path if path.suffix == SUFFIX else None
    if not path.is_dir() or (path / "config.json").exists():
        return None
    found = sorted(path.glob(f"*{SUFFIX}"))
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise ModelLoadError(f"{path} holds several GGUF files ({names}); pass the one to load")
    return found[0] if found else None


@functools.lru_cache(maxsize=2)
def _cached_header(file: str, mtime_ns: int, size: int) -> GGUFHeader:
    return GGUFHeader(Path(file))


def _header(file: Path) -> GGUFHeader:
    """The parsed header of ``file``, shared by config and weight loading."""
    stat = file.stat()
    return _cached_header(str(file), stat.st_mtime_ns, stat.st_size)


def release_pages(file: Path) -> None:
    """Drop the map's pages (the header's: tensors are read apart) from this process's
    resident memory once the model is built. The map is private and never written, so
    nothing is lost (``MADV_DONTNEED`` on clean pages)."""
    _header(file).release_pages()
    _cached_header.cache_clear()


def architecture(header: GGUFHeader) -> str:
    arch = header.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(
            f"GGUF file {header.path} has no general.architecture; it is not a model file"
        )
    if arch not in MODULE_NAMES:
        raise ModelLoadError(
            f"GGUF architecture {arch!r} is not supported; pace reads GGUF files of "
            f"{', '.join(MODULE_NAMES)} (or convert the model to a Hugging Face directory)"
        )
    return arch


def load_config(file: Path) -> Any:
    """The model config from GGUF metadata, as transformers reads it (see :func:`_converted`)."""
    from transformers import AutoConfig

    architecture(_header(file))
    try:
        return _converted(file, "config", AutoConfig)
    except Exception as exc:
        raise ModelLoadError(f"cannot read the config of GGUF file {file}: {exc}") from None


def load_tokenizer(file: Path) -> Any:
    """The tokenizer from GGUF metadata, as transformers converts it (see :func:`_converted`)."""
    from transformers import AutoTokenizer

    from pace_core.models import tokenizer

    try:
        return _converted(file, "tokenizer", AutoTokenizer, tokenizer.load)
    except Exception as exc:
        model = _header(file).metadata.get("tokenizer.ggml.model", "?")
        raise ModelLoadError(
            f"cannot build the tokenizer of GGUF file {file} (tokenizer.ggml.model {model!r}; "
            f"{type(exc).__name__}: {exc}); pass the original model's tokenizer "
            "(LLMModel(..., tokenizer=AutoTokenizer.from_pretrained(hf_dir))) or "
            "load_tokenizer=False to work with token ids"
        ) from None


def _converted(
    file: Path, what: str, auto: Any, load_saved: Callable[[Path], Any] | None = None
) -> Any:
    """``auto.from_pretrained`` of ``file``'s metadata, converted once per file and saved under
    ``$PACE_CACHE_DIR/gguf-meta/`` (transformers parses every metadata field, the whole
    vocabulary included, for either: seconds and a few hundred MB of transient memory that
    loading the saved copy does not cost). The saved copy is read by ``load_saved`` (default
    ``auto.from_pretrained``)."""
    saved = _meta_cache(file) / f"{what}-alone"  # (converted beside other files before)
    if saved.is_dir():
        try:
            obj = load_saved(saved) if load_saved else auto.from_pretrained(str(saved))
        except (OSError, ValueError):  # a damaged cache entry: convert again
            shutil.rmtree(saved, ignore_errors=True)
        else:
            return _named(obj, file)
    # from a folder of its own: transformers mixes in any tokenizer / config files beside the
    # GGUF (an HF checkpoint's folder), which replaced the file's chat template and EOS
    with tempfile.TemporaryDirectory(prefix="pace-gguf-") as alone:
        (Path(alone) / file.name).symlink_to(file.resolve())
        obj = auto.from_pretrained(alone, gguf_file=file.name)
    staging = saved.with_name(f"{what}.{os.getpid()}.partial")
    try:
        obj.save_pretrained(str(staging))
        staging.rename(saved)
    except OSError:  # a read-only cache, or another process saved it first: fine either way
        shutil.rmtree(staging, ignore_errors=True)
    return _named(obj, file)


def _named(obj: Any, file: Path) -> Any:
    """``obj`` named after the file's folder (not the conversion's temporary one)."""
    if hasattr(obj, "_name_or_path"):
        obj._name_or_path = str(file.parent)
    return obj


def _meta_cache(file: Path) -> Path:
    from pace_core.paths import derived_entry

    return derived_entry("gguf-meta", file, file.stem)


def _hf_name(gguf_name: str, table: dict[str, str]) -> str | None:
    module, _, suffix = gguf_name.rpartition(".")
    match = re.fullmatch(r"blk\.(\d+)\.(.+)", module)
    key, layer = (f"blk.{{i}}.{match[2]}", match[1]) if match else (module, "")
    hf = table.get(key)
    return None if hf is None else f"{hf.format(i=layer)}.{suffix}"


def _unpermute_rows(rows: int, heads: int) -> torch.Tensor:
    """Row order undoing llama.cpp's Q/K permutation (rope pairs interleaved per head)."""
    half = rows // heads // 2
    return torch.arange(rows).view(heads, half, 2).transpose(1, 2).reshape(-1)


_FLOATS = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def _tensor(header: GGUFHeader, t: TensorInfo) -> torch.Tensor | QuantizedWeight:
    """One GGUF tensor: a float tensor, or a :class:`QuantizedWeight` over the file's bytes
    (read into memory of its own: freed when a kernel that repacked it drops it)."""
    kind = BY_GGML_TYPE[t.ggml_type]
    data, shape = header.read(t), t.shape
    if kind.block_elems == 1:  # f32 / f16 / bf16
        return data.view(_FLOATS[kind.name]).reshape(shape)
    if len(shape) != 2:
        raise ModelLoadError(f"GGUF tensor {t.name} is {kind.name} with shape {shape}: not 2-D")
    return QuantizedWeight(kind.name, shape, torch.float32, data.reshape(shape[0], -1))


def _load(
    header: GGUFHeader,
    t: TensorInfo,
    rows: torch.Tensor | None,
    offset: float,
    dtype: torch.dtype | None = None,  # the store converts (float tensors here are small)
) -> torch.Tensor | QuantizedWeight:
    w = _tensor(header, t)
    if rows is not None:
        w = w.rows(rows) if isinstance(w, QuantizedWeight) else w[rows]
    if offset:
        w = w.float() + offset
    return w


def load_weights(file: Path, config: Any) -> WeightStore:
    """Every tensor of ``file`` under its Hugging Face name, read when taken.

    Raises before anything is built when a tensor has a type pace cannot read; a tensor
    name pace does not map stays under its GGUF name, so the builder's strict check reports
    it as unexpected (tolerated with ``strict=False``).
    """
    header = _header(file)
    arch = architecture(header)
    table = MODULE_NAMES[arch]
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    loaders: dict[str, Loader] = {}
    unknown_types = set()
    for t in header.tensors:
        if t.ggml_type not in BY_GGML_TYPE:
            unknown_types.add(t.type_name)
            continue
        if t.name in HARMLESS:
            continue
        name = _hf_name(t.name, table)
        if name is None:  # kept under its GGUF name: reported as unexpected (strict=False: ignored)
            loaders[t.name] = partial(_load, header, t, None, 0.0)
            continue
        rows = None
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            n = heads if "q_proj" in name else kv_heads
            rows = _unpermute_rows(t.shape[0], n)
        offset = -1.0 if arch == "gemma3" and name.endswith("norm.weight") else 0.0
        loaders[name] = partial(_load, header, t, rows, offset)
        loaders[name].shape = t.shape
    if unknown_types:
        supported = ", ".join(bt.name.upper() for bt in BY_GGML_TYPE.values())
        raise ModelLoadError(
            f"GGUF file {file} has tensors of type {', '.join(sorted(unknown_types))}, which "
            f"pace cannot read; supported: {supported}. Re-quantize it to one of those "
            "(llama-quantize) or load the original checkpoint with quantization='int4'"
        )
    return WeightStore(loaders, str(file))
