"""From a model name to a built :class:`DecoderLM`: path resolution, config, weights, builder."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from pace_core.errors import ConfigError, ModelLoadError
from pace_core.models import gguf_source, heap
from pace_core.models.builder import ModelBuilder
from pace_core.models.decoder import DecoderLM
from pace_core.models.shape_check import check_shapes
from pace_core.models.weights import WeightStore
from pace_core.opconfig import OpResolver
from pace_core.plugins import PluginHost
from pace_core.quant import QuantizationConfig

log = logging.getLogger("pace.models")

SUPPORTED_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in SUPPORTED_DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.lower() in SUPPORTED_DTYPES:
        return SUPPORTED_DTYPES[dtype.lower()]
    raise ConfigError(
        f"unsupported dtype {dtype!r}; use torch.float32 or torch.bfloat16 "
        "(float16 is not supported on CPU: its matmuls are emulated and slow)"
    )


def resolve_model_path(name: str | os.PathLike) -> Path:
    """A local directory, a GGUF file, a pace zoo name (prepared on demand) or a hub id in the
    HF cache."""
    if not isinstance(name, str | os.PathLike):
        raise ConfigError(
            f"model must be a directory, GGUF file, zoo name or hub id (a str or path), not "
            f"{type(name).__name__} {name!r}"
        )
    path = Path(name).expanduser()
    gguf = gguf_source.find_gguf(path)
    if gguf is not None:
        return gguf
    if path.is_dir():
        return path
    from pace_core import zoo

    if zoo.is_zoo_name(str(name)):
        return zoo.pull(str(name))
    if path.exists():
        raise ModelLoadError(_not_a_model(path))
    try:
        from huggingface_hub import snapshot_download

        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        return Path(snapshot_download(str(name), local_files_only=offline))
    except Exception as exc:
        raise ModelLoadError(
            f"model {str(name)!r} is not a local directory, not a pace zoo model "
            f"({', '.join(m.name for m in zoo.list_models())}) and could not be fetched from the "
            f"Hugging Face hub ({type(exc).__name__}: {exc}). Download it first, or set "
            "HF_HUB_OFFLINE=1 and make sure it is in the local HF cache."
        ) from None


def _not_a_model(file: Path) -> str:
    """Why ``file`` (no directory, no ``.gguf``) is no model to load."""
    try:
        with open(file, "rb") as f:
            magic = f.read(4)
    except OSError:
        magic = b""
    if magic == b"GGUF":
        return f"{file} is a GGUF file named without the {gguf_source.SUFFIX} suffix; rename it"
    return (
        f"{file} is a file but not a GGUF model ({gguf_source.SUFFIX}); pass the model "
        "directory that contains it"
    )


def load_config(path: Path) -> Any:
    """The HF config of a model directory or GGUF file."""
    from transformers import AutoConfig

    if path.suffix == gguf_source.SUFFIX:
        return gguf_source.load_config(path)
    if not (path / "config.json").exists():
        raise ModelLoadError(f"{path} has no config.json: not a Hugging Face model directory")
    try:
        return AutoConfig.from_pretrained(str(path))
    except Exception as exc:
        raise ModelLoadError(f"cannot read {path / 'config.json'}: {exc}") from None


def load_tokenizer(path: Path) -> Any:
    """The tokenizer of a model directory (:func:`pace_core.models.tokenizer.load`) or GGUF file.

    Parsing a large vocabulary leaves part of its transient heap mapped, so the heap is trimmed
    after it."""
    if path.suffix == gguf_source.SUFFIX:
        tokenizer = gguf_source.load_tokenizer(path)
    else:
        from pace_core.models import tokenizer as lean

        try:
            tokenizer = lean.load(path)
        except (OSError, ValueError) as exc:  # no tokenizer files, or none transformers reads
            raise ModelLoadError(
                f"cannot load a tokenizer from {path} ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:240]}); add its tokenizer files, pass another "
                "(tokenizer=...), or run without one (load_tokenizer=False: token ids in and out)"
            ) from None
    heap.trim()
    return tokenizer


def tokenizer_for(given: Any, model_path: Path | None) -> Any:
    """The tokenizer a model uses: ``given`` (a tokenizer, or a directory, GGUF file, zoo name
    or hub id to load one from), else the model's own from ``model_path`` (None: none)."""
    if given is None:
        return None if model_path is None else load_tokenizer(model_path)
    if isinstance(given, str | os.PathLike):
        return load_tokenizer(resolve_model_path(given))
    if not (callable(given) and hasattr(given, "decode")):
        raise ConfigError(
            f"tokenizer must be a tokenizer (callable, with decode) or a path or name to load "
            f"one from, not {type(given).__name__} {given!r}"[:300]
        )
    return given


def load_weights(path: Path, config: Any) -> WeightStore:
    """The checkpoint's tensors, read when taken, their shapes checked against ``config``."""
    if path.suffix == gguf_source.SUFFIX:
        weights = gguf_source.load_weights(path, config)
    else:
        weights = WeightStore.from_dir(path)
    check_shapes(weights, config)
    return weights


def _without_family(
    path: Path,
    config: Any,
    dtype: torch.dtype,
    host: PluginHost,
    resolver: OpResolver,
    cache_layout: str,
    quantization: QuantizationConfig | None,
    *,
    strict: bool,
) -> Any:
    """A model type with no pace family: transformers' code compiled with the pace backend
    when transformers knows it (:mod:`~pace_core.models.transformers_decoder`), else an error
    naming the supported types."""
    from pace_core.models import transformers_decoder

    model_type = getattr(config, "model_type", None)
    known = ", ".join(sorted(host.models)) or "none (is the pace.models plugin disabled?)"
    if not transformers_decoder.supported_by_transformers(model_type):
        raise ModelLoadError(f"unsupported model_type {model_type!r} in {path}; supported: {known}")
    if path.suffix == gguf_source.SUFFIX or quantization is not None:
        what = "a GGUF file" if path.suffix == gguf_source.SUFFIX else "quantization"
        raise ModelLoadError(
            f"model_type {model_type!r} has no pace family, so it runs transformers' own code, "
            f"which pace cannot give {what}; load the safetensors checkpoint unquantized "
            f"(pace families: {known})"
        )
    log.warning(
        "model_type %r has no pace family: running transformers' modeling code compiled with "
        "the pace backend (its linears, MLPs, norms and attention on plugin kernels; see "
        "op_plan). A family runs faster: its decoder stack is fused.",
        model_type,
    )
    return transformers_decoder.load(path, config, dtype, resolver, cache_layout, strict=strict)


def build_model(
    path: Path,
    config: Any,
    dtype: torch.dtype,
    host: PluginHost,
    resolver: OpResolver,
    *,
    strict: bool = True,
    quiet: bool = False,
    cache_layout: str = "contiguous",
    profiler: Any | None = None,
    quantization: QuantizationConfig | None = None,
    record: dict[str, Any] | None = None,
    kv_dtype: str | None = None,
) -> DecoderLM:
    """Read the checkpoint and build the model with the builder registered for its type
    (quantizing its matrices on the way in when ``quantization`` says so; ``record`` collects
    them by checkpoint name). ``kv_dtype``: the KV cache storage dtype the attention kernels
    must read (None: the model dtype)."""
    model_type = getattr(config, "model_type", None)
    spec = host.models.get(model_type)
    if spec is None:
        if kv_dtype is not None:
            raise ConfigError(
                f"kv_cache_dtype {kv_dtype!r} needs a pace model family; model_type "
                f"{model_type!r} runs transformers' own code: use kv_cache_dtype 'auto'"
            )
        return _without_family(
            path, config, dtype, host, resolver, cache_layout, quantization, strict=strict
        )
    weights = load_weights(path, config)
    if not quiet:
        weights.show_progress()
    builder = ModelBuilder(config, weights, dtype, resolver, cache_layout, quantization)
    builder.profiler = profiler
    builder.quantized = record
    builder.kv_dtype = kv_dtype
    with torch.no_grad():
        model = spec.builder(builder)
    tolerated = weights.finish(getattr(spec.builder, "harmless_extras", ()), strict=strict)
    if path.suffix == gguf_source.SUFFIX:
        gguf_source.release_pages(path)
    heap.trim()
    if tolerated:
        log.warning(
            "ignored %d unexpected tensors (strict=False): %s",
            len(tolerated),
            ", ".join(tolerated[:5]),
        )
    return model
