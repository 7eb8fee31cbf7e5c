"""Hand freed heap back to the OS while and after loading (glibc ``malloc_trim``).

A load converts and packs tensors one at a time; their transients (tens of MB each) are
freed, but glibc keeps such memory mapped (its mmap threshold grows with the allocations it
sees), so without a trim they add up in the process's RSS: SmolLM2 fp32 grew by ~350 MB of
freed transients over its 30 layers. A no-op where the C library has no ``malloc_trim``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

TRIM_EVERY_BYTES = 64 << 20
"""While loading: trim after this many bytes of weights were taken since the last trim."""


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None


def trim() -> None:
    """Return the free pages of the heap to the OS (milliseconds)."""
    fn = _malloc_trim()
    if fn is not None:
        fn(0)


class TrimEvery:
    """Counts bytes handled and trims the heap each time :data:`TRIM_EVERY_BYTES` pass."""

    def __init__(self, every: int = TRIM_EVERY_BYTES) -> None:
        self.every, self.pending = every, 0

    def add(self, nbytes: int) -> None:
        self.pending += nbytes
        if self.pending >= self.every:
            self.pending = 0
            trim()
