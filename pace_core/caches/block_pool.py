"""Which blocks of a block cache are in use, free or cached: :class:`BlockPool`.

Automatic prefix caching: a *full* block whose tokens are known gets a key, the chained hash
of (its parent's key, its tokens, and the cache's and request's namespace: model, dtype,
quantization, a per-request ``cache_salt``); :func:`block_keys`. A later sequence whose prompt
starts with the same full blocks adopts them (:meth:`BlockPool.match` +
:meth:`BlockPool.share`) instead of computing their keys and values again.

Every block is in exactly one state:

* **in use**: referenced by ``ref[b] >= 1`` sequences (a shared block by several);
* **cached**: ``ref[b] == 0`` but keyed; kept in least-recently-used order and handed out
  again (its key forgotten) only when no free block is left;
* **free**: ``ref[b] == 0`` and not keyed.

Nothing here touches tensors: copying a block for copy-on-write is the cache's job.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Callable, Iterable, Sequence

import torch

__all__ = ["BlockPool", "block_keys"]

BlockKey = bytes


def block_keys(
    tokens: Sequence[int] | torch.Tensor, block_size: int, namespace: bytes = b""
) -> list[BlockKey]:
    """Chained keys of the full blocks of ``tokens``: key ``i`` covers ``tokens[:(i+1)*bs]``
    and ``namespace`` (two different namespaces never share a block)."""
    ids = torch.as_tensor(tokens, dtype=torch.int64).reshape(-1)
    full = ids.numel() // block_size
    data = ids[: full * block_size].numpy().tobytes()
    width = block_size * 8
    keys, parent = [], hashlib.blake2b(namespace, digest_size=16).digest()
    for i in range(full):
        block = data[i * width : (i + 1) * width]
        parent = hashlib.blake2b(parent + block, digest_size=16).digest()
        keys.append(parent)
    return keys


class BlockPool:
    """Reference counts, the free stack and the prefix index of ``num_blocks`` blocks.

    Args:
        num_blocks: blocks in the cache.
        caching: keep released keyed blocks for reuse (automatic prefix caching).
    """

    def __init__(self, num_blocks: int, caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.caching = caching
        self.ref = [0] * num_blocks
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))  # a stack: O(1) pop/push
        self.key_of: dict[int, BlockKey] = {}
        self.block_of: dict[BlockKey, int] = {}
        self.cached: collections.OrderedDict[int, None] = collections.OrderedDict()  # LRU first
        # called with (block, key) before a cached block is handed out again (the disk tier
        # saves it while its contents are still there)
        self.on_evict: Callable[[int, BlockKey], None] | None = None

    # -- counts ----------------------------------------------------------------------------
    @property
    def available(self) -> int:
        """Blocks a step can take: free ones and cached ones (evicted on demand)."""
        return len(self.free) + len(self.cached)

    @property
    def used(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.num_blocks - self.available

    # -- taking and giving back ------------------------------------------------------------
    def take(self, n: int) -> list[int]:
        """``n`` blocks for new tokens (ref 1): free ones first, then the least recently used
        cached ones, whose keys are forgotten. The caller checked ``n <= available``."""
        if n > self.available:
            raise RuntimeError(f"take({n}) with {self.available} blocks available")
        out = []
        for _ in range(n):
            if self.free:
                b = self.free.pop()
            else:
                b, _ = self.cached.popitem(last=False)
                if self.on_evict is not None:
                    self.on_evict(b, self.key_of[b])
                del self.block_of[self.key_of.pop(b)]
            self.ref[b] = 1
            out.append(b)
        return out

    def share(self, blocks: Iterable[int]) -> None:
        """One more reference to each of ``blocks`` (a cached block is in use again)."""
        for b in blocks:
            if self.ref[b] == 0:
                self.cached.pop(b)
            self.ref[b] += 1

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each of ``blocks``; the unreferenced become cached (keyed,
        when caching) or free. Given in table order, the tail is released first, so it is
        evicted first: a prefix's head outlives its tail."""
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] < 0:
                raise RuntimeError(f"block {b} released more often than referenced")
            if self.ref[b]:
                continue
            if b in self.key_of:
                self.cached[b] = None
            else:
                self.free.append(b)

    def forget(self, b: int) -> None:
        """Drop ``b``'s key (its contents are about to change)."""
        key = self.key_of.pop(b, None)
        if key is not None:
            del self.block_of[key]

    def shared(self, b: int) -> bool:
        """Writing into ``b`` would change what another sequence or the index sees."""
        return self.ref[b] > 1 or b in self.key_of

    # -- the prefix index ------------------------------------------------------------------
    def match(self, keys: Sequence[BlockKey]) -> list[int]:
        """The blocks of the longest run of ``keys`` (from the first) found in the index."""
        out = []
        for key in keys:
            b = self.block_of.get(key)
            if b is None:
                break
            out.append(b)
        return out

    def register(self, key: BlockKey, b: int) -> None:
        """Index the full block ``b`` under ``key`` (a key already indexed keeps its block)."""
        if not self.caching or key in self.block_of or b in self.key_of:
            return
        self.key_of[b] = key
        self.block_of[key] = b

    def touch(self, blocks: Iterable[int]) -> None:
        """Mark cached ``blocks`` as recently used."""
        for b in blocks:
            if b in self.cached:
                self.cached.move_to_end(b)

    def clear_cached(self) -> None:
        """Forget every cached (unreferenced) block: they become free."""
        for b in list(self.cached):
            self.forget(b)
            self.free.append(b)
        self.cached.clear()

    def check(self) -> None:
        """Raise ``AssertionError`` when the bookkeeping is inconsistent (tests)."""
        free, cached = set(self.free), set(self.cached)
        assert len(free) == len(self.free), "a block is on the free stack twice"
        assert not free & cached, "a block is both free and cached"
        for b in range(self.num_blocks):
            in_use = self.ref[b] > 0
            assert in_use + (b in free) + (b in cached) == 1, f"block {b} in no or two states"
            assert b not in free or b not in self.key_of, f"free block {b} has a key"
        assert all(self.block_of[k] == b for b, k in self.key_of.items()), "index out of sync"
        assert len(self.block_of) == len(self.key_of), "index out of sync"
