"""The ranks of one tensor-parallel group and what they say to each other: a gloo process
group (its own, not torch.distributed's global one: several groups may live in one process),
the all-reduce and gather of the forward pass, and rank 0's step messages.

Every forward is announced by rank 0 before it runs, in one fixed-size int64 broadcast (a
header and, inline when it fits, the payload: the step's token ids, the cache step as rank
0's cache planned it and the caches rank 0 dropped since the last message; a larger payload
follows in a second broadcast), or the hidden states an LM head reads. The other ranks
replay it on their shard (:mod:`pace_core.parallel.model`).
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

import torch
import torch.distributed as dist

from pace_core.errors import PaceError
from pace_core.parallel.shm import ShmExchange

HEADER = 16
MESSAGE = 1024  # int64s per broadcast message: the header, then a payload that fits inline
INLINE = MESSAGE - HEADER
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# no timeout an idle server could reach: a rank that dies closes its connections instead
TIMEOUT = datetime.timedelta(days=365)


class RankFailure(PaceError, RuntimeError):
    """Another rank of the group is gone (its process died); the group cannot run again."""


class Kind(IntEnum):
    STEP = 1  # a forward's hidden states over a cache step
    HEAD = 2  # the LM head over the hidden states that follow
    STOP = 3  # the group is closing


@dataclass
class StepMessage:
    """One forward as rank 0 planned it: rows ``ids [B, T]`` over cache ``cache_id``
    (``num_blocks`` x ``block_size``), its step (``seq_ids``, ``starts``, ``counts``, block
    ``table``, copy-on-write ``copies``), and the caches rank 0 dropped (``dead``)."""

    cache_id: int
    num_blocks: int
    block_size: int
    ids: torch.Tensor
    seq_ids: list[int]
    starts: list[int]
    counts: list[int]
    table: torch.Tensor
    copies: list[tuple[int, int]]
    dead: list[int]
    last_only: bool
    head: int = 0  # the LM head after the states: 0 none, 1 over the last position, 2 all


def joined_key(rank: int) -> str:
    """The store key a rank > 0 sets when it is about to join the group."""
    return f"pace-tp-joined-{rank}"


class Comm:
    """Rank ``rank``'s end of a group of ``size`` ranks meeting at ``store`` (or the TCP store
    at ``host:port``, which rank 0 runs)."""

    def __init__(
        self,
        rank: int,
        size: int,
        *,
        store: dist.Store | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        timeout: float = 300,
        shm: Path | None = None,
    ) -> None:
        """``shm``: the group's shared-memory segment (:mod:`~pace_core.parallel.shm`), mapped
        before joining (rank 0 may unlink it once every rank joined)."""
        self.rank, self.size = rank, size
        self.failure: str | None = None  # why the group cannot run (a rank is gone)
        self.shm = None
        if shm is not None:
            self.shm = ShmExchange(shm, rank, size, failed=lambda: self.failure)
        if store is None:
            store = dist.TCPStore(
                host, port, size, rank == 0, timeout=datetime.timedelta(seconds=timeout)
            )
        if rank:
            store.set(joined_key(rank), "1")  # rank 0 waits for these (or a rank's exit)
        self.pg = dist.ProcessGroupGloo(store, rank, size, TIMEOUT)
        self._header = torch.zeros(MESSAGE, dtype=torch.long)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def _fail(self, exc: Exception) -> RankFailure:
        self.failure = self.failure or f"a tensor-parallel rank is gone ({exc})"
        return RankFailure(self.failure)

    def _check(self) -> None:
        if self.failure is not None:
            raise RankFailure(self.failure)

    # -- the forward's collectives -------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` (contiguous) over the ranks, in place; returns it."""
        shm = self.shm
        try:
            if shm is not None and shm.fits(tensor):
                return shm.all_reduce(tensor)
            self.pg.allreduce(tensor).wait()
        except RuntimeError as exc:
            raise self._fail(exc) from None
        return tensor

    def gather(self, tensor: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's ``tensor`` (same shape), in rank order, on rank 0 (None elsewhere);
        through shared memory, views valid until the next collective but one."""
        tensor = tensor.contiguous()
        shm = self.shm
        try:
            if shm is not None and shm.fits(tensor):
                parts = shm.exchange(tensor)
                return parts if self.leader else None
            out = [torch.empty_like(tensor) for _ in range(self.size)] if self.leader else []
            self.pg.gather(out, tensor, 0).wait()
        except RuntimeError as exc:
            raise self._fail(exc) from None
        return out if self.leader else None

    def _broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        try:
            self.pg.broadcast(tensor, 0).wait()
        except RuntimeError as exc:
            raise self._fail(exc) from None
        return tensor

    # -- rank 0's messages ---------------------------------------------------------------------
    def send_step(self, msg: StepMessage) -> None:
        self._check()
        b, t = msg.ids.shape
        cols = msg.table.shape[1]
        flat = [
            msg.ids.reshape(-1),
            torch.tensor(msg.seq_ids + msg.starts + msg.counts, dtype=torch.long),
            msg.table.reshape(-1).to(torch.long),
            torch.tensor([x for pair in msg.copies for x in pair] + msg.dead, dtype=torch.long),
        ]
        payload = torch.cat(flat)
        n = payload.numel()
        h = self._header
        h[:12] = torch.tensor([Kind.STEP, msg.cache_id, msg.num_blocks, msg.block_size, b, t,
                               int(msg.last_only), cols, len(msg.copies), len(msg.dead), n,
                               msg.head])  # fmt: skip
        if n <= INLINE:
            h[HEADER : HEADER + n] = payload
        self._broadcast(h)
        if n > INLINE:
            self._broadcast(payload)

    def send_head(self, hidden: torch.Tensor) -> None:
        self._check()
        h = self._header
        h[:HEADER] = 0
        h[0], h[1], h[2] = Kind.HEAD, DTYPES.index(hidden.dtype), hidden.dim()
        h[3 : 3 + hidden.dim()] = torch.tensor(hidden.shape)
        self._broadcast(h)
        self._broadcast(hidden.contiguous())

    def send_stop(self) -> None:
        h = self._header
        h[:HEADER] = 0
        h[0] = Kind.STOP
        self._broadcast(h)

    def receive(self) -> tuple[Kind, StepMessage | torch.Tensor | None]:
        """The next message from rank 0 (ranks > 0): a step, the hidden states of a head, or
        the stop."""
        buf = self._broadcast(torch.zeros(MESSAGE, dtype=torch.long))
        h = buf[:HEADER].tolist()
        kind = Kind(h[0])
        if kind is Kind.STOP:
            return kind, None
        if kind is Kind.HEAD:
            shape = h[3 : 3 + h[2]]
            return kind, self._broadcast(torch.empty(shape, dtype=DTYPES[h[1]]))
        _, cache_id, num_blocks, block_size, b, t, last_only, cols, n_copies, n_dead, n, head = h[
            :12
        ]
        if n <= INLINE:
            payload = buf[HEADER : HEADER + n]
        else:
            payload = self._broadcast(torch.empty(n, dtype=torch.long))
        ids, rest = payload[: b * t].view(b, t), payload[b * t :]
        meta = rest[: 3 * b].tolist()
        table = rest[3 * b : 3 * b + b * cols].view(b, cols)
        tail = rest[3 * b + b * cols :].tolist()
        copies = [(tail[2 * i], tail[2 * i + 1]) for i in range(n_copies)]
        msg = StepMessage(cache_id, num_blocks, block_size, ids, meta[:b], meta[b : 2 * b],
                          meta[2 * b :], table, copies, tail[2 * n_copies :][:n_dead],
                          bool(last_only), head)  # fmt: skip
        return kind, msg

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already broken or shut down
            self.pg.shutdown()
        if self.shm is not None:
            self.shm.close()


def concat_vocab(parts: Sequence[torch.Tensor], vocab: int) -> torch.Tensor:
    """The full logits from the ranks' padded vocabulary shares (last dim)."""
    return torch.cat(list(parts), dim=-1)[..., :vocab]
