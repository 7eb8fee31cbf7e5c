"""Build one rank's shard of a model: its sliced weights, its shard config, its builder."""

from __future__ import annotations

import logging
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from pace_core.errors import ConfigError
from pace_core.models import gguf_source, heap, loader
from pace_core.opconfig import OpResolver
from pace_core.parallel.builder import ShardBuilder
from pace_core.parallel.comm import Comm
from pace_core.parallel.config import TensorParallelConfig
from pace_core.parallel.model import ShardedDecoderLM
from pace_core.parallel.shard import check, shard_config, slice_rule
from pace_core.plugins import PluginHost
from pace_core.quant import QuantizationConfig

log = logging.getLogger("pace.parallel")


def build_shard(
    path: Path,
    config: Any,
    dtype: torch.dtype,
    host: PluginHost,
    resolver: OpResolver,
    comm: Comm,
    *,
    cache_layout: str,
    strict: bool = True,
    quiet: bool = False,
    profiler: Any | None = None,
    quantization: QuantizationConfig | None = None,
    kv_dtype: str | None = None,
) -> ShardedDecoderLM:
    """Rank ``comm.rank``'s shard of the model at ``path`` (each weight read as the slice the
    rank keeps, where the file format allows)."""
    check(config, comm.size)
    spec = host.models[config.model_type]
    weights = loader.load_weights(path, config)
    weights.slice_by(slice_rule(comm.rank, comm.size))
    if not quiet:
        weights.show_progress(f"Loading shard {comm.rank}/{comm.size}")
    builder = ShardBuilder(
        shard_config(config, comm.size), weights, dtype, resolver, cache_layout, quantization,
        comm=comm,
    )  # fmt: skip
    builder.profiler = profiler
    if kv_dtype is not None:  # the KV cache storage dtype the attention kernels read
        builder.kv_dtype = kv_dtype
    with torch.no_grad():
        model = spec.builder(builder)
    weights.finish(getattr(spec.builder, "harmless_extras", ()), strict=strict)
    if path.suffix == gguf_source.SUFFIX:
        gguf_source.release_pages(path)
    heap.trim()
    return ShardedDecoderLM(**{f.name: getattr(model, f.name) for f in fields(model)}, comm=comm)


def check_options(size: int, kv_cache_type: str, layout: str, prefix_cache_dir: Any) -> None:
    """ConfigError for load options tensor parallelism cannot take (before the load)."""
    if size == 1:
        return
    if layout not in ("paged", "slab"):
        raise ConfigError(
            f"tensor_parallel={size} needs a block cache (kv_cache_type 'paged' or 'slab_pool'), "
            f"not {kv_cache_type!r}: the other ranks mirror rank 0's KV blocks"
        )
    if prefix_cache_dir is not None:
        raise ConfigError(
            f"tensor_parallel={size} with prefix_cache_dir is not supported: each rank holds "
            "its own KV heads, and the disk tier stores one process's blocks"
        )


def load_tensor_parallel(
    tp: TensorParallelConfig,
    path: Path,
    config: Any,
    dtype: torch.dtype,
    host: PluginHost,
    resolver: OpResolver,
    *,
    kv_cache_type: str,
    opconfig: Any,
    cache_options: dict[str, Any] | None = None,
    strict: bool = True,
    quiet: bool = False,
    profiler: Any | None = None,
    quantization: QuantizationConfig | None = None,
    kv_dtype: str | None = None,
    **_: Any,
) -> ShardedDecoderLM:
    """Start ranks 1..N-1 (:class:`~pace_core.parallel.group.RankGroup`) and build rank 0's
    shard in this process; the model stops the other ranks on ``close()``. The other ranks'
    caches take ``cache_options`` too (their geometry is rank 0's caches')."""
    from pace_core.parallel.group import RankGroup

    check(config, tp.size)
    extra = {k: v for k, v in (cache_options or {}).items()
             if k not in ("memory_gb", "max_tokens") and v is not None}  # fmt: skip
    model_args = {
        "path": path, "dtype": dtype, "kv_cache_type": kv_cache_type, "opconfig": opconfig,
        "strict": strict, "quantization": quantization, "profile": profiler is not None,
        "cache_options": extra, "kv_dtype": kv_dtype,
    }  # fmt: skip
    group = RankGroup(tp, model_args)
    try:
        model = build_shard(
            path, config, dtype, host, resolver, group.comm,
            cache_layout=host.caches[kv_cache_type].layout, strict=strict, quiet=quiet,
            profiler=profiler, quantization=quantization, kv_dtype=kv_dtype,
        )  # fmt: skip
    except BaseException:
        group.close()
        raise
    model.group = group
    return model
