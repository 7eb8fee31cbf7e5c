"""The KV cache an :class:`~pace_core.engine.llm.LLMModel` uses: its registered type, storage
dtype, pool budget and prefix caching, checked against each other before the (slow) load."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from pace_core.caches.disk_tier import DEFAULT_DISK_GB
from pace_core.caches.kv_quant import AUTO, coerce_kv_dtype
from pace_core.caches.pages import check_budget
from pace_core.caches.prefix_disk import check_disk_budget
from pace_core.errors import ConfigError
from pace_core.registry import CacheSpec, Registry

BLOCK_LAYOUTS = ("paged", "slab")  # the layouts whose caches share blocks and take a budget


@dataclass(frozen=True)
class KVCacheChoice:
    """A checked KV cache choice: ``options`` go to every cache the model makes."""

    name: str  # the registered kv_cache_type
    spec: CacheSpec
    dtype: str  # the storage dtype: AUTO (the model's) or INT8
    options: dict[str, Any]  # memory_gb, max_tokens (and kv_dtype unless AUTO)
    prefix_caching: bool


def choose_kv_cache(
    caches: Registry[str, CacheSpec],
    kv_cache_type: Any,
    kv_cache_dtype: Any = None,
    *,
    memory_gb: Any = None,
    max_tokens: Any = None,
    prefix_caching: bool | None = None,
    prefix_cache_dir: str | os.PathLike | None = None,
    prefix_cache_disk_gb: float = DEFAULT_DISK_GB,
) -> KVCacheChoice:
    """The cache ``kv_cache_type`` of the registry ``caches`` with these options; a
    ConfigError naming the bad value and the fix."""
    spec = caches.get(kv_cache_type)
    name = str(kv_cache_type)  # a KVCacheType member is its name
    if spec is None:
        available = ", ".join(sorted(caches)) or (
            "none: no plugin registers a KV cache (is pace.caches in PACE_DISABLE_PLUGINS?)"
        )
        shown = repr(name) if isinstance(kv_cache_type, str) else repr(kv_cache_type)
        raise ConfigError(f"unknown kv_cache_type {shown}; available: {available}")
    blocks = spec.layout in BLOCK_LAYOUTS
    check_budget(memory_gb, max_tokens)
    if not blocks and (memory_gb is not None or max_tokens is not None):
        raise ConfigError(
            f"kv_cache_memory_gb / max_cache_tokens size a block cache's pool; kv_cache_type "
            f"{name!r} grows per sequence instead: use kv_cache_type 'paged' or 'slab_pool', "
            "or leave the budget out"
        )
    dtype = coerce_kv_dtype(kv_cache_dtype)
    if dtype not in spec.kv_dtypes:
        raise ConfigError(
            f"kv_cache_dtype {dtype!r} is not supported by kv_cache_type {name!r} (it stores "
            f"{', '.join(sorted(spec.kv_dtypes))}); use kv_cache_type 'paged' or 'slab_pool', "
            "or kv_cache_dtype 'auto'"
        )
    if prefix_caching and not blocks:
        raise ConfigError(
            f"prefix_caching needs a block cache (kv_cache_type 'paged' or 'slab_pool'), "
            f"not {name!r}"
        )
    prefix_caching = blocks if prefix_caching is None else bool(prefix_caching)
    if prefix_cache_dir is not None and not prefix_caching:
        raise ConfigError(
            "prefix_cache_dir keeps prefix-cached KV blocks on disk: it needs prefix caching "
            f"on a block cache (kv_cache_type 'paged' or 'slab_pool', not {name!r}, and "
            "prefix_caching not False)"
        )
    if prefix_cache_dir is not None:
        check_disk_budget(prefix_cache_disk_gb)
    options: dict[str, Any] = {"memory_gb": memory_gb, "max_tokens": max_tokens}
    if dtype != AUTO:
        options["kv_dtype"] = dtype
    return KVCacheChoice(name, spec, dtype, options, prefix_caching)
