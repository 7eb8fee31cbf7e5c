"""Built-in plugin: registers the KV cache types shipped with pace."""

from __future__ import annotations

from pace_core.caches.dynamic import DynamicCache
from pace_core.hookspecs import hookimpl
from pace_core.registry import CacheRegistry


@hookimpl
def pace_register_kv_caches(registry: CacheRegistry) -> None:
    registry.add_cache("dynamic", DynamicCache, layout="contiguous",
                       description="contiguous per-layer buffers, geometric growth")  # fmt: skip
