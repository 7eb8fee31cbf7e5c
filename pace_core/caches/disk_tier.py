"""A prefix cache that survives restarts: KV blocks on disk, keyed by their prefix keys.

A :class:`DiskBlockStore` is one directory per *identity*: the cache's namespace (model path,
dtype, quantization), a fingerprint of the weight files (:func:`weights_fingerprint`) and the
block layout (block size, every layer's shapes, the dtype). A store opened with another
identity lives in another directory, so a cache directory written by another model, dtype or
set of weights is never read. Inside, each block is one safetensors file named by its key
(the chained hash of :func:`~pace_core.caches.block_pool.block_keys`, which covers every token
before it and the request's cache salt), holding the block's keys and values of every layer.

Writes happen on one background thread (write to a temporary file, then rename: a reader
never sees half a block); the files are kept under a byte cap, least recently used first
(a restored block counts as used). A file that does not load, or whose metadata or shapes do
not match, is ignored with a warning and removed.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import queue
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from pace_core.caches.block_pool import BlockKey, BlockPool
from pace_core.errors import ConfigError

log = logging.getLogger("pace.caches.disk")

FORMAT = "pace-kv-block-1"
DEFAULT_DISK_GB = 4.0  # the default cap (``prefix_cache_disk_gb``, ``--prefix-cache-disk-gb``)
MAX_PENDING_BYTES = 256 << 20  # snapshots waiting for the writer; beyond, spills are skipped

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values of one block


def weights_fingerprint(path: Path) -> str:
    """A cheap identity of a model's files: names, sizes and the first and last MiB of each
    weight file, and config.json (a changed checkpoint at the same path gets another one)."""
    files = [path] if path.is_file() else sorted(
        p for p in path.iterdir()
        if p.suffix in (".safetensors", ".bin", ".gguf", ".pt") or p.name == "config.json"
    )  # fmt: skip
    digest = hashlib.blake2b(digest_size=16)
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}|{size}|".encode())
        with file.open("rb") as f:
            digest.update(f.read(1 << 20))
            if size > 2 << 20:
                f.seek(-(1 << 20), os.SEEK_END)
                digest.update(f.read())
    return digest.hexdigest()


class DiskBlockStore:
    """KV blocks of one identity under ``root`` (see the module doc).

    Args:
        root: the cache directory (``--prefix-cache-dir``); created if missing.
        identity: what must match for a block to be reused (namespace, fingerprint, layout).
        max_bytes: the cap on the files' total size.
    """

    def __init__(self, root: Path | str, identity: dict[str, object], max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ConfigError(f"the disk prefix cache cap must be > 0 bytes (got {max_bytes})")
        self.identity = json.dumps(identity, sort_keys=True)
        store_id = hashlib.blake2b(self.identity.encode(), digest_size=12).hexdigest()
        self.dir = Path(root) / store_id
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"prefix cache directory {root}: cannot create it ({exc})") from None
        self.store_id = store_id
        self.max_bytes = max_bytes
        self._check_manifest()
        self._lock = threading.Lock()
        self._files: OrderedDict[BlockKey, int] = OrderedDict()  # key -> bytes, LRU first
        self._writing: set[BlockKey] = set()  # queued or being written
        self._scan()
        self._queue: queue.Queue[tuple[BlockKey, Layers] | None] = queue.Queue()
        self._pending = 0
        self.written = 0  # blocks this store wrote
        self._writer = threading.Thread(target=self._write_loop, name="pace-kv-disk", daemon=True)
        self._writer.start()
        atexit.register(self.flush)  # blocks queued at exit still reach the disk

    # -- the directory ------------------------------------------------------------------------
    def _check_manifest(self) -> None:
        """Write the identity beside the blocks; a directory whose manifest says otherwise
        (a hash collision, a hand-copied directory) is emptied."""
        manifest = self.dir / "manifest.json"
        if manifest.is_file():
            try:
                same = json.loads(manifest.read_text()).get("identity") == self.identity
            except (OSError, ValueError):
                same = False
            if same:
                return
            log.warning("prefix cache %s: another model's manifest; blocks dropped", self.dir)
            for file in self.dir.glob("*.safetensors"):
                file.unlink(missing_ok=True)
        tmp = manifest.with_suffix(".tmp")
        tmp.write_text(json.dumps({"format": FORMAT, "identity": self.identity}))
        os.replace(tmp, manifest)

    def _scan(self) -> None:
        found = []
        for file in self.dir.glob("*.safetensors"):
            try:
                key = bytes.fromhex(file.stem)
                stat = file.stat()
            except (ValueError, OSError):
                continue
            found.append((stat.st_mtime, key, stat.st_size))
        for _, key, size in sorted(found):
            self._files[key] = size

    def _path(self, key: BlockKey) -> Path:
        return self.dir / f"{key.hex()}.safetensors"

    def __contains__(self, key: BlockKey) -> bool:
        """Whether ``key`` is stored or on its way."""
        with self._lock:
            return key in self._files or key in self._writing

    def __len__(self) -> int:
        with self._lock:
            return len(self._files)

    # -- reading --------------------------------------------------------------------------------
    def load(
        self, key: BlockKey, like: Sequence[tuple[torch.Tensor, torch.Tensor]]
    ) -> Layers | None:
        """The block stored under ``key``, checked against ``like`` (one block's keys and
        values per layer: shapes and dtypes); None if absent or unusable (warned, removed)."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = self._path(key)
        with self._lock:
            if key not in self._files:
                return None
            self._files.move_to_end(key)
        try:
            tensors = load_file(str(path))
            layers = [(tensors[f"k.{i}"], tensors[f"v.{i}"]) for i in range(len(like))]
            problem = _mismatch(layers, like) or (
                None if len(tensors) == 2 * len(like) else "extra tensors"
            )
        except FileNotFoundError:  # another process evicted it
            self._drop(key)
            return None
        except (SafetensorError, OSError, KeyError, ValueError, RuntimeError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if problem is not None:
            log.warning("prefix cache: ignoring unusable block file %s (%s)", path, problem)
            self._drop(key)
            path.unlink(missing_ok=True)
            return None
        os.utime(path)  # most recently used, for the next start's order
        return layers

    def _drop(self, key: BlockKey) -> None:
        with self._lock:
            self._files.pop(key, None)

    # -- writing --------------------------------------------------------------------------------
    def save(self, key: BlockKey, layers: Layers) -> bool:
        """Queue a block (a snapshot the caller no longer touches) for writing; False when it
        is already stored or too many bytes wait."""
        size = sum(k.nbytes + v.nbytes for k, v in layers)
        with self._lock:
            if key in self._files or key in self._writing:
                return False
            if self._pending + size > MAX_PENDING_BYTES:
                return False
            self._writing.add(key)
            self._pending += size
        self._queue.put((key, layers))
        return True

    def flush(self) -> None:
        """Wait until every queued block is on disk."""
        self._queue.join()

    def close(self) -> None:
        """Flush and stop the writer."""
        self._queue.put(None)
        self._writer.join()

    def _write_loop(self) -> None:
        from safetensors.torch import save_file

        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                key, layers = item
                size = sum(k.nbytes + v.nbytes for k, v in layers)
                tensors = {}
                for i, (k, v) in enumerate(layers):
                    tensors[f"k.{i}"], tensors[f"v.{i}"] = k.contiguous(), v.contiguous()
                path = self._path(key)
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                meta = {"format": FORMAT, "store": self.store_id}
                try:
                    save_file(tensors, str(tmp), metadata=meta)
                    os.replace(tmp, path)
                    written = True
                except Exception as exc:  # the writer outlives any one bad block
                    log.warning("prefix cache: cannot write %s (%s)", path, exc)
                    tmp.unlink(missing_ok=True)
                    written = False
                with self._lock:
                    self._pending -= size
                    self._writing.discard(key)
                    if written:
                        self._files[key] = size
                        self.written += 1
                self._evict()
            finally:
                self._queue.task_done()

    def _evict(self) -> None:
        """Remove the least recently used files until the total is under the cap."""
        while True:
            with self._lock:
                total = sum(self._files.values())
                if total <= self.max_bytes or len(self._files) <= 1:
                    return
                key, _ = self._files.popitem(last=False)
            self._path(key).unlink(missing_ok=True)


class DiskTier:
    """A block cache's link to its store: saves blocks (when the pool evicts one, and every
    indexed block on :meth:`spill`) and restores a prompt's blocks into the pool (the cache's
    ``adopt_prefix`` asks)."""

    def __init__(
        self,
        store: DiskBlockStore,
        keys: Sequence[torch.Tensor],
        values: Sequence[torch.Tensor],
        pool: BlockPool,
    ) -> None:
        self.store = store
        self.keys, self.values, self.pool = keys, values, pool

    @staticmethod
    def identity(cache: Any) -> dict[str, object]:
        """What a stored block of a block ``cache`` must match besides its key: the block
        layout, the pools' dtype and the cache's namespace (model, dtype, quantization)."""
        return {
            "block_size": cache.block_size,
            "keys": [list(k.shape[1:]) for k in cache.keys],
            "values": [list(v.shape[1:]) for v in cache.values],
            "dtype": str(cache.keys[0].dtype),
            "namespace": cache.namespace.hex(),
        }

    @classmethod
    def attach(cls, cache: Any, store: DiskBlockStore) -> DiskTier:
        """Give a prefix-caching block ``cache`` (a
        :class:`~pace_core.caches.blocks.BlockCache`) this tier over ``store``."""
        if not cache.pool.caching:
            raise ConfigError("a disk prefix cache needs prefix caching: enable it first")
        tier = cls(store, cache.keys, cache.values, cache.pool)
        cache.disk = tier
        cache.pool.on_evict = tier.save_block
        return tier

    @staticmethod
    def detach(cache: Any) -> None:
        """The cache stops using its tier (the files stay)."""
        cache.disk = None
        cache.pool.on_evict = None

    def layers(self, b: int) -> Layers:
        """Block ``b``'s keys and values in every layer (views into the pools)."""
        return [(k[b], v[b]) for k, v in zip(self.keys, self.values)]

    def save_block(self, b: int, key: BlockKey) -> bool:
        """Queue a snapshot of block ``b`` unless the store has ``key``."""
        if key in self.store:
            return False
        return self.store.save(key, [(k.clone(), v.clone()) for k, v in self.layers(b)])

    def spill(self) -> int:
        """Queue every indexed block not yet on disk (the engine calls it when it goes idle
        and when it stops); returns how many were queued."""
        return sum(self.save_block(b, key) for b, key in list(self.pool.key_of.items()))

    def restore(self, keys: Sequence[BlockKey]) -> list[int]:
        """Blocks for the leading ``keys`` found on disk, loaded into new pool blocks
        (indexed, referenced once by the caller's sequence)."""
        out: list[int] = []
        like = self.layers(0)
        for key in keys:
            if key not in self.store or not self.pool.available:
                break
            layers = self.store.load(key, like)
            if layers is None:
                break
            (b,) = self.pool.take(1)
            for (k, v), (pool_k, pool_v) in zip(layers, self.layers(b)):
                pool_k.copy_(k)
                pool_v.copy_(v)
            self.pool.register(key, b)
            out.append(b)
        return out


def _mismatch(layers: Layers, like: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> str | None:
    for i, ((k, v), (k0, v0)) in enumerate(zip(layers, like)):
        for name, got, want in (("keys", k, k0), ("values", v, v0)):
            if got.shape != want.shape or got.dtype != want.dtype:
                return (
                    f"layer {i} {name}: {tuple(got.shape)} {got.dtype}, the cache holds "
                    f"{tuple(want.shape)} {want.dtype}"
                )
    return None
