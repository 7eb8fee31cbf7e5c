"""Built-in plugin: registers the KV cache types shipped with pace."""

from __future__ import annotations

from pace_core.caches.blocks import PagedCache, SlabPoolCache
from pace_core.caches.contiguous import BMCCache, DynamicCache
from pace_core.caches.kv_quant import KV_DTYPES
from pace_core.hookspecs import hookimpl
from pace_core.registry import Registrations

PACE_CONTRACT_VERSION = 1  # the pace_core.CONTRACT_VERSION this plugin implements


@hookimpl
def pace_register_kv_caches(registry: Registrations) -> None:
    registry.add_cache(
        "dynamic",
        DynamicCache,
        layout="contiguous",
        description="contiguous per-sequence rows, geometric growth",
        value_dims=True,
    )
    registry.add_cache(
        "bmc",
        BMCCache,
        layout="contiguous",
        description="contiguous rows grown in sqrt(max_seq_len) segments",
        value_dims=True,
    )
    registry.add_cache(
        "paged",
        PagedCache,
        layout="paged",
        description="shared pool of 64-token blocks, per-sequence block tables",
        value_dims=True,
        kv_dtypes=KV_DTYPES,
    )
    registry.add_cache(
        "slab_pool",
        SlabPoolCache,
        layout="slab",
        description="pre-allocated pool of L2-sized blocks, O(1) free list",
        value_dims=True,
        kv_dtypes=KV_DTYPES,
    )
