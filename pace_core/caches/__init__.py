"""KV caches: the per-sequence cache contract (base.py) and the built-in cache types."""

from __future__ import annotations

from enum import Enum


class KVCacheType(str, Enum):
    """The built-in KV cache types (AMD PACE's names). Each member *is* its cache name, so it is
    accepted wherever a name string is (``kv_cache_type=KVCacheType.PAGED`` or ``"paged"``);
    plugins may register more names."""

    DYNAMIC = "dynamic"
    BMC = "bmc"
    PAGED = "paged"
    SLAB_POOL = "slab_pool"

    def __str__(self) -> str:
        return self.value
