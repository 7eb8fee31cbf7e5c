"""All-reduce and gather through shared memory between the ranks of one machine.

Every rank maps one segment (a file in ``/dev/shm``, unlinked once all ranks mapped it):
a 64-byte flag line per rank, then two banks of one slot per rank. Call ``s`` (counted alike
on every rank) uses bank ``s % 2``: a rank copies its tensor into its slot, stores ``s`` in
its flag, waits until every flag is ``>= s`` and reads the slots. Two banks make one wait per
call enough: a rank that writes call ``s + 2``'s data has seen every rank arrive at call
``s + 1``, which they do after reading call ``s``'s. x86 keeps stores in order (the data
before the flag) and loads in order (the flag before the data), so no fence is needed
beyond the ordered Python calls. Every rank sums the same slots in rank order, so all hold
bitwise the same result.

A tensor larger than a slot goes through gloo (:class:`~pace_core.parallel.comm.Comm`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

LINE = 64  # bytes per rank's flag (a cache line: no false sharing)
DATA_OFFSET = 4096
DEFAULT_SLOT_BYTES = 16 << 20  # a 512-token x 4096 fp32 prefill chunk (8 MiB) fits twice
SPINS_BEFORE_CHECK = 4096  # ~5 ms of polling between looks at the group's health
SPINS_BEFORE_YIELD = 1024  # ~1.5 ms: past it, the waiting rank yields its core now and then


def segment_path(tag: str) -> Path:
    """Where a group's segment lives while its ranks map it."""
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/tmp")
    return root / f"pace-tp-{os.getpid()}-{tag}"


def segment_bytes(size: int, slot_bytes: int) -> int:
    return DATA_OFFSET + 2 * size * slot_bytes


def create_segment(path: Path, size: int, slot_bytes: int = DEFAULT_SLOT_BYTES) -> None:
    """The zero-filled segment file (pages are allocated as they are first written)."""
    with open(path, "wb") as f:
        f.truncate(segment_bytes(size, slot_bytes))


class ShmExchange:
    """Rank ``rank``'s view of the segment at ``path`` shared by ``size`` ranks.

    ``failed()`` is polled while waiting: it returns why the group is broken (a rank died),
    which is raised, or None.
    """

    def __init__(
        self,
        path: Path,
        rank: int,
        size: int,
        slot_bytes: int = DEFAULT_SLOT_BYTES,
        failed: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.rank, self.size, self.slot_bytes = rank, size, slot_bytes
        self.failed = failed
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), segment_bytes(size, slot_bytes))
        flags = np.frombuffer(self._map, dtype=np.int64, count=size * LINE // 8)
        self._flags = flags[:: LINE // 8]  # [size]: one per line
        data = torch.frombuffer(self._map, dtype=torch.uint8, offset=DATA_OFFSET)
        self._slots = data.view(2, size, slot_bytes)
        self.seq = 0

    def fits(self, tensor: torch.Tensor) -> bool:
        return tensor.numel() * tensor.element_size() <= self.slot_bytes

    def exchange(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor`` (same shape and dtype on all; it must fit a slot), in rank
        order, as views valid until the call after next."""
        self.seq += 1
        seq = self.seq
        nbytes = tensor.numel() * tensor.element_size()
        bank = self._slots[seq & 1, :, :nbytes].view(tensor.dtype).view(self.size, *tensor.shape)
        bank[self.rank].copy_(tensor)
        self._flags[self.rank] = seq
        flags = self._flags
        spins = 0
        while flags.min() < seq:
            spins += 1
            if spins >= SPINS_BEFORE_YIELD and spins % 64 == 0:
                time.sleep(0)  # a long wait (a rank descheduled, a busy host): let others run
            if spins % SPINS_BEFORE_CHECK == 0:
                why = self.failed()
                if why is not None:
                    raise RuntimeError(why)
        return list(bank.unbind(0))

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks into ``tensor`` (in rank order: bitwise equal on every rank)."""
        parts = self.exchange(tensor)
        tensor.copy_(parts[0])
        for part in parts[1:]:
            tensor.add_(part)
        return tensor

    def close(self) -> None:
        self._slots = self._flags = None
        with contextlib.suppress(BufferError):  # a view is alive: it goes with the process
            self._map.close()
