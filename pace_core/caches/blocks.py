"""Block caches: a pre-allocated pool of fixed-size token blocks per layer, shared by all
sequences through per-sequence block tables; O(1) allocation and free from a free list.

- PAGED (layout ``paged``): vLLM-style block tables, 64-token blocks (``PACE_PAGED_BLOCK_TOKENS``
  overrides); pool size from a memory budget (``kv_cache_memory_gb``) or a token count
  (``PACE_MAX_CACHE_TOKENS``).
- SLAB_POOL (layout ``slab``): blocks sized so one block of K and V of one layer fits half the
  L2 cache (``PACE_SLAB_BLOCK_TOKENS`` overrides); attention runs per sequence.

Exhaustion raises :class:`CacheFullError` before anything changes, so the caller can queue.

Automatic prefix caching (:meth:`BlockCache.enable_prefix_caching`, on in the server): the
full blocks of a sequence's known tokens are indexed once written, and a new sequence adopts
the longest indexed run of its prompt's full blocks (:meth:`BlockCache.adopt_prefix`) instead
of computing it; see :mod:`pace_core.caches.block_pool`. Shared blocks are reference-counted
and copied before a sequence writes into one (copy-on-write: beam-search forks share their
blocks, a rollback may crop into an indexed block).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from pace_core.caches.base import CacheFullError, StepMeta
from pace_core.caches.block_pool import BlockKey, BlockPool, block_keys
from pace_core.caches.disk_tier import DiskTier
from pace_core.caches.kv_quant import (
    AUTO,
    INT8,
    coerce_kv_dtype,
    pack_rows,
    pool_width,
    row_bytes,
    unpack_rows,
)
from pace_core.caches.pages import check_budget, check_fits, lazy_zeros, populate
from pace_core.errors import ConfigError

DEFAULT_MAX_TOKENS = 32768


@dataclass(frozen=True)
class BlockKV:
    """Attention view of one layer: pools ``[num_blocks, H, block, D]`` and block tables.
    An int8 pool (``kv_dtype="int8"``) holds rows of int8 values and their scales: see
    :mod:`pace_core.caches.kv_quant`."""

    key_pool: torch.Tensor
    value_pool: torch.Tensor
    block_table: torch.Tensor  # [B, max_blocks] int64 (unused entries 0)
    block_size: int
    meta: StepMeta
    layout: str


@dataclass(frozen=True)
class BlockBuffers:
    """What a fused decoder stack needs to write and read a step itself (``block_buffers``):
    the per-layer pools ``[num_blocks, H, block_size, D]`` and the current step's block table
    ``[B, max_blocks]`` (int64; row ``b`` = sequence ``meta.seq_ids[b]``, unused entries 0)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    block_table: torch.Tensor
    block_size: int


def l2_cache_bytes(default: int = 1 << 20) -> int:
    """L2 size of CPU 0 from sysfs (``2048K`` → bytes), or ``default``."""
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index2/size").read_text().strip()
        units = {"K": 1 << 10, "M": 1 << 20}
        return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
    except (OSError, ValueError, IndexError):
        return default


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"{name} must be a positive integer (got {value!r})") from None
    if number < 1:
        raise ConfigError(f"{name} must be a positive integer (got {value!r})")
    return number


class BlockCache:
    """Shared machinery of PAGED and SLAB_POOL."""

    layout = "paged"

    def __init__(
        self,
        num_kv_heads: Sequence[int],
        head_dims: Sequence[int],
        dtype: torch.dtype,
        *,
        block_size: int,
        max_tokens: int | None = None,
        memory_gb: float | None = None,
        value_dims: Sequence[int] | None = None,
        kv_dtype: str = AUTO,
        **_: object,
    ) -> None:
        self.block_size = block_size
        self.kv_dtype = coerce_kv_dtype(kv_dtype)
        value_dims = list(head_dims if value_dims is None else value_dims)
        if not len(num_kv_heads) == len(head_dims) == len(value_dims):
            raise ConfigError(
                f"per-layer cache dims disagree: {len(num_kv_heads)} KV head counts, "
                f"{len(head_dims)} key dims, {len(value_dims)} value dims"
            )
        self.bytes_per_block = sum(
            h * (row_bytes(kv_dtype, dtype, d) + row_bytes(kv_dtype, dtype, dv)) * block_size
            for h, d, dv in zip(num_kv_heads, head_dims, value_dims)
        )
        check_budget(memory_gb, max_tokens)
        if memory_gb is not None:
            num_blocks = int(memory_gb * (1 << 30)) // self.bytes_per_block
        else:
            env = None if max_tokens else _env_int("PACE_MAX_CACHE_TOKENS")
            tokens = max_tokens or env or DEFAULT_MAX_TOKENS
            num_blocks = -(-tokens // block_size)
            what = "PACE_MAX_CACHE_TOKENS" if env else "max_cache_tokens"
            check_fits(num_blocks * self.bytes_per_block, f"{what}={tokens}")
        if num_blocks < 1:
            raise ConfigError("the KV cache budget is smaller than one block; raise it")
        self.num_blocks = num_blocks
        self.dtype = dtype  # of the model: what get_kv_states returns
        pool_dtype = torch.int8 if kv_dtype == INT8 else dtype
        self.keys = [
            lazy_zeros((num_blocks, h, block_size, pool_width(kv_dtype, d)), pool_dtype)
            for h, d in zip(num_kv_heads, head_dims)
        ]
        self.values = [
            lazy_zeros((num_blocks, h, block_size, pool_width(kv_dtype, dv)), pool_dtype)
            for h, dv in zip(num_kv_heads, value_dims)
        ]
        self.pool = BlockPool(num_blocks, caching=False)
        self.namespace = b""
        self.blocks: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}
        self._keys: dict[int, list[BlockKey]] = {}  # keys of a sequence's known full blocks
        self._indexed: dict[int, int] = {}  # how many of them are in the index
        self.prefix_queries = 0  # prompt tokens looked up by adopt_prefix
        self.prefix_hits = 0  # of which adopted
        self.disk: DiskTier | None = None  # the persistent tier (DiskTier.attach)
        self.disk_hits = 0  # adopted tokens restored from it
        self._next_id = 0
        self._meta: StepMeta | None = None
        self._write: tuple[torch.Tensor, ...] | None = None
        self._table: torch.Tensor | None = None
        # (from, to) blocks copied by the current step's copy-on-write (what a mirror replays)
        self.step_copies: list[tuple[int, int]] = []

    # -- prefix caching --------------------------------------------------------------------
    def enable_prefix_caching(self, namespace: bytes = b"") -> None:
        """Index written full blocks of known tokens and let new sequences adopt them.
        ``namespace`` names what else changes the KV (model, dtype, quantization)."""
        self.pool.caching = True
        self.namespace = namespace

    def populate(self) -> int:
        """Commit every page of the pools now (:func:`~pace_core.caches.pages.populate`), so
        no step of a long-lived cache (the serving engine's) takes a page fault; contents
        are kept. Returns the bytes committed."""
        return sum(populate(pool) for pool in (*self.keys, *self.values))

    @property
    def prefix_caching(self) -> bool:
        return self.pool.caching

    def adopt_prefix(self, seq_id: int, tokens: Sequence[int], salt: str = "") -> int:
        """Give the new, empty ``seq_id`` the longest indexed run of ``tokens``' full blocks
        (never all of ``tokens``: the last one is always computed, for its logits) and
        remember the keys of its full blocks, indexed as they are written. Returns the
        number of tokens adopted (0 without prefix caching). ``salt`` isolates tenants."""
        if not self.pool.caching:
            return 0
        if self.lens[seq_id] or self.blocks[seq_id]:
            raise ValueError(f"adopt_prefix needs an empty sequence ({seq_id} holds tokens)")
        keys = block_keys(tokens, self.block_size, self.namespace + salt.encode())
        found = self._match(keys, len(tokens))
        self.pool.share(found)
        limit = (len(tokens) - 1) // self.block_size
        if self.disk is not None and len(found) < limit:
            restored = self.disk.restore(keys[len(found) : limit])
            self.disk_hits += len(restored) * self.block_size
            found += restored
        self.prefix_queries += len(tokens)
        self.prefix_hits += len(found) * self.block_size
        self.blocks[seq_id] = list(found)
        self.lens[seq_id] = len(found) * self.block_size
        self._keys[seq_id], self._indexed[seq_id] = keys, len(found)
        return self.lens[seq_id]

    def cached_prefix_tokens(self, tokens: Sequence[int], salt: str = "") -> int:
        """How many tokens :meth:`adopt_prefix` would adopt for ``tokens`` now."""
        if not self.pool.caching:
            return 0
        return len(self._match(self.prefix_keys(tokens, salt), len(tokens))) * self.block_size

    def prefix_keys(self, tokens: Sequence[int], salt: str = "") -> list[BlockKey]:
        """The index keys of ``tokens``' full blocks (a key covers every token before it)."""
        return block_keys(tokens, self.block_size, self.namespace + salt.encode())

    def _match(self, keys: list[BlockKey], num_tokens: int) -> list[int]:
        return self.pool.match(keys[: (num_tokens - 1) // self.block_size])

    def _index_written(self, seq_id: int) -> None:
        keys = self._keys.get(seq_id)
        if not keys:
            return
        full = min(self.lens[seq_id] // self.block_size, len(keys))
        blocks = self.blocks[seq_id]
        for i in range(self._indexed[seq_id], full):
            self.pool.register(keys[i], blocks[i])
        self._indexed[seq_id] = max(self._indexed[seq_id], full)

    # -- sequences -------------------------------------------------------------------------
    def add_sequences(self, count: int) -> list[int]:
        ids = list(range(self._next_id, self._next_id + count))
        self._next_id += count
        for sid in ids:
            self.blocks[sid], self.lens[sid] = [], 0
        return ids

    def free_sequence(self, seq_id: int) -> None:
        self.pool.release(self.blocks.pop(seq_id))
        del self.lens[seq_id]
        self._keys.pop(seq_id, None)
        self._indexed.pop(seq_id, None)

    def retain(self, seq_ids: list[int]) -> list[int]:
        for sid in [s for s in self.blocks if s not in set(seq_ids)]:
            self.free_sequence(sid)
        out, seen = [], set()
        for sid in seq_ids:
            out.append(self._fork(sid) if sid in seen else sid)
            seen.add(sid)
        return out

    def _fork(self, seq_id: int) -> int:
        """A sequence sharing ``seq_id``'s blocks (beam search duplicates); each copies a
        shared block before writing into it."""
        (new,) = self.add_sequences(1)
        self.blocks[new] = list(self.blocks[seq_id])
        self.pool.share(self.blocks[new])
        self.lens[new] = self.lens[seq_id]
        if seq_id in self._keys:
            self._keys[new], self._indexed[new] = self._keys[seq_id], self._indexed[seq_id]
        return new

    @property
    def num_free_blocks(self) -> int:
        """Blocks a step can take: free ones and unreferenced cached ones."""
        return self.pool.available

    @property
    def free_tokens(self) -> int:
        return self.num_free_blocks * self.block_size

    def _copy_on_write(self, seq_ids: list[int], meta: StepMeta) -> list[tuple[int, int]]:
        """(sequence, block index) of the shared blocks this step writes into."""
        out = []
        for sid, before, n in zip(seq_ids, meta.starts, meta.counts):
            i = before // self.block_size
            if n and i < len(self.blocks[sid]) and self.pool.shared(self.blocks[sid][i]):
                out.append((sid, i))
        return out

    def _copy_block(self, sid: int, i: int) -> None:
        old = self.blocks[sid][i]
        (new,) = self.pool.take(1)
        self._copy_pools(old, new)
        self.step_copies.append((old, new))
        self.pool.release([old])
        self.blocks[sid][i] = new

    def _copy_pools(self, old: int, new: int) -> None:
        for pool in (*self.keys, *self.values):
            pool[new] = pool[old]

    # -- steps -----------------------------------------------------------------------------
    def begin_step(self, seq_ids: list[int], num_new, width: int) -> StepMeta:
        meta = StepMeta(list(seq_ids), [self.lens[s] for s in seq_ids], num_new, width)
        bs = self.block_size
        need = [max(0, -(-a // bs) - len(self.blocks[s])) for s, a in zip(seq_ids, meta.ends)]
        copies = self._copy_on_write(seq_ids, meta)
        if sum(need) + len(copies) > self.pool.available:
            raise CacheFullError(
                f"KV cache full: step needs {sum(need) + len(copies)} blocks of {bs} tokens, "
                f"{self.pool.available} free of {self.num_blocks}",
                requested_tokens=sum(meta.counts),
                free_tokens=self.free_tokens,
            )
        self.step_copies = []
        for sid, i in copies:
            self._copy_block(sid, i)
        for sid, n in zip(seq_ids, need):
            self.blocks[sid].extend(self.pool.take(n))
        most = max((len(self.blocks[s]) for s in seq_ids), default=0)
        table = torch.tensor(
            [self.blocks[s] + [0] * (most - len(self.blocks[s])) for s in seq_ids],
            dtype=torch.long,
        ).view(len(seq_ids), most)
        self._meta, self._table, self._write = meta, table, None
        return meta

    def _write_index(self) -> tuple[torch.Tensor, ...]:
        """Where each new real token goes, (row, t) -> (block, offset), for all layers:
        row ``b``'s last ``num_new[b]`` positions ``t`` hold the tokens at positions
        ``lens_before[b] + j``, in block ``table[b, pos // block_size]``."""
        meta, bs = self._meta, self.block_size
        src_b = torch.repeat_interleave(torch.arange(len(meta.seq_ids)), meta.num_new)
        first = torch.cumsum(meta.num_new, 0) - meta.num_new  # index of each row's first token
        j = torch.arange(src_b.numel()) - first[src_b]
        pos = meta.lens_before[src_b] + j
        src_t = meta.width - meta.num_new[src_b] + j
        return src_b, src_t, self._table[src_b, pos // bs], pos % bs

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> BlockKV:
        if self._write is None:  # computed once per step, on the first layer that writes
            self._write = self._write_index()
        src_b, src_t, dst_block, dst_off = self._write
        k, v = k[src_b, :, src_t], v[src_b, :, src_t]
        if self.kv_dtype == INT8:
            k, v = pack_rows(k), pack_rows(v)
        self.keys[layer][dst_block, :, dst_off] = k
        self.values[layer][dst_block, :, dst_off] = v
        return BlockKV(
            self.keys[layer],
            self.values[layer],
            self._table,
            self.block_size,
            self._meta,
            self.layout,
        )

    def block_buffers(self) -> BlockBuffers:
        """Pools and the current step's block table, for fused decoder stacks, which may
        write a step's keys/values themselves instead of calling :meth:`update`, exactly as
        it does: row ``b``'s last ``meta.num_new[b]`` positions go to the positions
        ``meta.lens_before[b] + j`` of its sequence, position ``p`` at offset
        ``p % block_size`` of block ``block_table[b, p // block_size]``. Valid between
        :meth:`begin_step` and :meth:`end_step`."""
        if self._table is None:
            raise RuntimeError("block_buffers() is only valid between begin_step and end_step")
        return BlockBuffers(self.keys, self.values, self._table, self.block_size)

    def end_step(self) -> None:
        for sid, n in zip(self._meta.seq_ids, self._meta.ends):
            self.lens[sid] = n
            self._index_written(sid)
        self._meta = self._write = self._table = None

    def mirror_step(
        self, meta: StepMeta, table: torch.Tensor, copies: Sequence[tuple[int, int]]
    ) -> None:
        """Begin a step another cache of the same geometry planned (a tensor-parallel rank
        replays rank 0's): its copy-on-write block copies, then writes and reads through
        ``table``; this cache's own bookkeeping is not used. :meth:`end_mirrored_step` ends
        it."""
        for old, new in copies:
            self._copy_pools(old, new)
        self._meta, self._table, self._write = meta, table, None

    def end_mirrored_step(self) -> None:
        self._meta = self._write = self._table = None

    # -- inspection and rollback ---------------------------------------------------------
    def crop(self, seq_id: int, num_tokens: int) -> None:
        have = self.lens[seq_id]
        if not 0 <= num_tokens <= have:
            raise ValueError(f"cannot crop {num_tokens} tokens from sequence {seq_id} of {have}")
        self.lens[seq_id] = have - num_tokens
        keep = -(-self.lens[seq_id] // self.block_size)
        blocks = self.blocks[seq_id]
        self.pool.release(blocks[keep:])
        del blocks[keep:]
        if seq_id in self._keys:  # tokens past the crop may be rewritten differently
            full = self.lens[seq_id] // self.block_size
            self._keys[seq_id] = self._keys[seq_id][:full]
            self._indexed[seq_id] = min(self._indexed[seq_id], full)

    def get_num_tokens(self, seq_id: int) -> int:
        return self.lens[seq_id]

    def gather(self, pool: torch.Tensor, seq_id: int) -> torch.Tensor:
        """``[H, tokens, D]`` of one sequence from a pool (a copy)."""
        blocks = torch.tensor(self.blocks[seq_id], dtype=torch.long)
        h, d = pool.shape[1], pool.shape[3]
        rows = len(blocks) * self.block_size  # explicit: d may be 0 (latent caches keep no values)
        return pool[blocks].transpose(0, 1).reshape(h, rows, d)[:, : self.lens[seq_id]]

    def get_kv_states(self, seq_id: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = [
            (self.gather(k, seq_id), self.gather(v, seq_id)) for k, v in zip(self.keys, self.values)
        ]
        if self.kv_dtype == INT8:
            out = [(unpack_rows(k, self.dtype), unpack_rows(v, self.dtype)) for k, v in out]
        return out

    def memory_used(self) -> int:
        return self.pool.used * self.bytes_per_block

    def memory_free(self) -> int:
        return self.pool.available * self.bytes_per_block


# Tokens per paged block. Attention streams each (block, KV head) run of block_size * head_dim
# elements; 16-token runs (2 KiB at head_dim 64, bf16) defeat the hardware prefetcher: SmolLM2
# bf16 batch-8 decode over 544 keys, 2 threads: 312 tok/s at 16, 417 at 32, 417 at 64, 424 at
# 128 and 416 on slab_pool (vLLM's CPU backend also uses large blocks).
PAGED_BLOCK_TOKENS = 64


class PagedCache(BlockCache):
    """PAGED: vLLM-style block tables over :data:`PAGED_BLOCK_TOKENS`-token blocks
    (``block_size`` or ``PACE_PAGED_BLOCK_TOKENS`` overrides)."""

    layout = "paged"

    def __init__(
        self, num_kv_heads, head_dims, dtype, *, block_size: int | None = None, **kw
    ) -> None:
        size = block_size or _env_int("PACE_PAGED_BLOCK_TOKENS") or PAGED_BLOCK_TOKENS
        super().__init__(num_kv_heads, head_dims, dtype, block_size=size, **kw)


def slab_block_tokens(
    num_kv_heads: Sequence[int],
    head_dims: Sequence[int],
    dtype: torch.dtype,
    max_seq_len: int = 1 << 30,
    value_dims: Sequence[int] | None = None,
    kv_dtype: str = AUTO,
) -> int:
    """Largest power of two (16..1024, at most ``max_seq_len``) whose K+V block of the widest
    layer fits L2 / 2."""
    override = _env_int("PACE_SLAB_BLOCK_TOKENS")
    if override:
        return override
    value_dims = head_dims if value_dims is None else value_dims
    per_token = max(
        h * (row_bytes(kv_dtype, dtype, d) + row_bytes(kv_dtype, dtype, dv))
        for h, d, dv in zip(num_kv_heads, head_dims, value_dims)
    )
    tokens = max(16, min((l2_cache_bytes() // 2) // per_token, max_seq_len))
    return min(1024, 1 << (tokens.bit_length() - 1))


class SlabPoolCache(BlockCache):
    """SLAB_POOL: L2-sized blocks from one pre-allocated pool per layer."""

    layout = "slab"

    def __init__(
        self,
        num_kv_heads,
        head_dims,
        dtype,
        *,
        block_size: int | None = None,
        max_seq_len: int = 1 << 30,
        value_dims: Sequence[int] | None = None,
        kv_dtype: str = AUTO,
        **kw,
    ) -> None:
        size = block_size or slab_block_tokens(
            num_kv_heads, head_dims, dtype, max_seq_len, value_dims, kv_dtype
        )
        super().__init__(
            num_kv_heads, head_dims, dtype, block_size=size, value_dims=value_dims,
            kv_dtype=kv_dtype, **kw,
        )  # fmt: skip
