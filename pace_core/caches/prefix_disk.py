"""The disk tier of one model's prefix caches (``prefix_cache_dir``,
``pace serve --prefix-cache-dir``): which store each of its block caches uses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pace_core.caches.blocks import BlockCache
from pace_core.caches.disk_tier import DiskBlockStore, DiskTier, weights_fingerprint
from pace_core.errors import ConfigError
from pace_core.values import is_real


def check_disk_budget(max_gb: object) -> None:
    """ConfigError unless ``prefix_cache_disk_gb`` is a number > 0."""
    if not (is_real(max_gb) and max_gb > 0):
        raise ConfigError(f"prefix_cache_disk_gb must be a number > 0 (got {max_gb!r})")


class PrefixDisk:
    """The disk tier of one model's prefix caches (``prefix_cache_dir``): a
    :class:`DiskBlockStore` per block layout, its identity carrying the model files'
    :func:`weights_fingerprint`, shared by the model's caches."""

    def __init__(self, root: Path | str, max_gb: float, model_path: Path) -> None:
        check_disk_budget(max_gb)
        self.root = Path(root)
        self.max_bytes = int(max_gb * (1 << 30))
        self.model_path = model_path
        self._fingerprint: str | None = None
        self._stores: dict[str, DiskBlockStore] = {}

    def attach(self, cache: Any) -> None:
        """Give a prefix-caching block cache its disk tier."""
        if not isinstance(cache, BlockCache):
            raise ConfigError(
                f"prefix_cache_dir needs one of pace's block caches (paged, slab_pool); a "
                f"{type(cache).__name__} has no disk tier"
            )
        if self._fingerprint is None:
            self._fingerprint = weights_fingerprint(self.model_path)
        identity = {**DiskTier.identity(cache), "weights": self._fingerprint}
        key = json.dumps(identity, sort_keys=True)
        if key not in self._stores:
            self._stores[key] = DiskBlockStore(self.root, identity, self.max_bytes)
        DiskTier.attach(cache, self._stores[key])
