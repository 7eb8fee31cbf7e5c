"""The sharded decoder: rank 0 runs the engine (scheduler, caches' bookkeeping, sampler) and
announces each forward; every other rank replays it on its shard.

Rank 0 drives, rather than every rank running the same engine: the engine's choices depend
on time (the prefill budget measures its rate) and on requests arriving between steps, so
identical cores on every rank would drift apart. What a forward needs is small: the token
ids, the cache step (starts, counts, block table and copy-on-write copies, exactly as rank
0's block cache planned it) and which of rank 0's caches it runs on. Each rank keeps one
cache per rank-0 cache, of the same geometry (blocks x block size) over its own KV heads,
and writes and reads it through rank 0's block tables (``BlockCache.mirror_step``); rank 0
alone allocates, frees, shares and evicts blocks.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from pace_core.caches.base import StepMeta
from pace_core.caches.blocks import BlockCache
from pace_core.errors import ConfigError
from pace_core.models.decoder import DecoderLM
from pace_core.models.layers import StepContext
from pace_core.parallel.comm import Comm, Kind, StepMessage, concat_vocab

log = logging.getLogger("pace.parallel")

HEAD_LAST, HEAD_ALL = 1, 2  # a forward message's head: the last position's logits, or all
# (num_blocks, block_size) -> a cache over this rank's KV heads of that geometry
CacheFactory = Callable[[int, int], BlockCache]


class CacheIds:
    """Rank 0's numbering of its caches, and the ones dropped since the last message."""

    def __init__(self) -> None:
        self._ids: weakref.WeakKeyDictionary[BlockCache, int] = weakref.WeakKeyDictionary()
        self._next = itertools.count()
        self.dead: list[int] = []

    def of(self, cache: Any) -> int:
        if not isinstance(cache, BlockCache):
            raise ConfigError(
                f"tensor parallelism runs on pace's block caches (paged, slab_pool); "
                f"{type(cache).__name__} cannot be mirrored on the other ranks"
            )
        found = self._ids.get(cache)
        if found is None:
            found = self._ids[cache] = next(self._next)
            weakref.finalize(cache, self._drop, found)
        return found

    def _drop(self, cache_id: int) -> None:
        self.dead.append(cache_id)

    def take_dead(self) -> list[int]:
        out, self.dead = self.dead, []
        return out


@dataclass
class ShardedDecoderLM(DecoderLM):
    """A :class:`DecoderLM` over one rank's shard (``comm``); on rank 0 each forward is sent
    to the other ranks first and the LM head's logits are gathered whole."""

    comm: Comm | None = None
    group: Any = None  # rank 0: the other ranks' processes (pace_core.parallel.group)
    caches: CacheIds = field(default_factory=CacheIds)
    announced: bool = False  # rank 0 inside a forward it announced whole (states and head)

    def forward(
        self, ids: torch.Tensor, step: StepContext, *, all_logits: bool = False
    ) -> torch.Tensor:
        """One message announces the states and the head (the common case: one broadcast)."""
        if not self.comm.leader:
            return super().forward(ids, step, all_logits=all_logits)
        head = HEAD_ALL if all_logits else HEAD_LAST
        self.comm.send_step(self._message(ids, step, not all_logits, head))
        self.announced = True
        try:
            return super().forward(ids, step, all_logits=all_logits)
        finally:
            self.announced = False

    def hidden_states(
        self, ids: torch.Tensor, step: StepContext, *, last_only: bool = False
    ) -> torch.Tensor:
        if self.comm.leader and not self.announced:
            self.comm.send_step(self._message(ids, step, last_only, 0))
        return super().hidden_states(ids, step, last_only=last_only)

    def _message(
        self, ids: torch.Tensor, step: StepContext, last_only: bool, head: int
    ) -> StepMessage:
        cache, meta = step.cache, step.meta
        cache_id = self.caches.of(cache)
        return StepMessage(
            cache_id, cache.num_blocks, cache.block_size, ids, list(meta.seq_ids),
            list(meta.starts), list(meta.counts), cache.block_buffers().block_table,
            list(cache.step_copies), self.caches.take_dead(), last_only, head,
        )  # fmt: skip

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits of the whole vocabulary (on rank 0; elsewhere this rank's share)."""
        comm = self.comm
        if comm.leader and not self.announced:
            comm.send_head(hidden)
        local = self.lm_head(hidden)
        parts = comm.gather(local)
        if parts is None:
            return local
        logits = concat_vocab(parts, self.vocab_size).float()
        if self.logit_softcap:
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        return logits

    def close(self) -> None:
        """Stop the other ranks (rank 0; idempotent)."""
        if self.group is not None:
            self.group.close()


def follow(model: ShardedDecoderLM, new_cache: CacheFactory) -> None:
    """The loop of a rank > 0: replay rank 0's forwards until it stops the group."""
    comm = model.comm
    caches: dict[int, BlockCache] = {}
    while True:
        kind, msg = comm.receive()
        if kind is Kind.STOP:
            return
        if kind is Kind.HEAD:
            model.head(msg)
            continue
        for dead in msg.dead:
            caches.pop(dead, None)
        cache = caches.get(msg.cache_id)
        if cache is None:
            cache = caches[msg.cache_id] = new_cache(msg.num_blocks, msg.block_size)
        meta = StepMeta(msg.seq_ids, msg.starts, msg.counts, int(msg.ids.shape[1]))
        cache.mirror_step(meta, msg.table, msg.copies)
        try:
            step = model.make_step(cache, meta)
            if msg.head:
                model.forward(msg.ids, step, all_logits=msg.head == HEAD_ALL)
            else:
                model.hidden_states(msg.ids, step, last_only=msg.last_only)
        finally:
            cache.end_mirrored_step()
