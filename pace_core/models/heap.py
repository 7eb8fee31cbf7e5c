"""Heap policy: hand freed heap back to the OS while loading (glibc ``malloc_trim``), keep
it while serving (:func:`keep_step_transients`), and keep the loaded objects out of Python's
cyclic collector while serving (:func:`loaded_objects_frozen`).

A load converts and packs tensors one at a time; their transients (tens of MB each) are
freed, but glibc keeps such memory mapped (its mmap threshold grows with the allocations it
sees), so without a trim they add up in the process's RSS: SmolLM2 fp32 grew by ~350 MB of
freed transients over its 30 layers. Each call is a no-op where the C library lacks it
(``malloc_trim``, ``mallopt``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import threading
from collections.abc import Callable, Iterator

TRIM_EVERY_BYTES = 64 << 20
"""While loading: trim after this many bytes of weights were taken since the last trim."""


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
STEP_MMAP_THRESHOLD = 64 << 20
STEP_TRIM_THRESHOLD = 256 << 20


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    return getattr(_libc(), "malloc_trim", None)


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


@functools.cache
def keep_step_transients() -> bool:
    """Serve a step's large transients from the heap from now on (once per process).

    glibc maps every block above its mmap threshold (at most 32 MB) afresh and unmaps it when
    freed, so the pages of such a block fault in again on every step: the float32 logits of
    32 rows of a 262k vocabulary (33 MB) took 12 ms to convert from bfloat16 instead of 2.
    Raising the threshold to :data:`STEP_MMAP_THRESHOLD` and the top-of-heap trim threshold to
    :data:`STEP_TRIM_THRESHOLD` keeps those pages between steps. For a process that runs steps
    (the serving engine), after its model is loaded: loading relies on giving memory back.
    Returns whether the C library took both settings.
    """
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, STEP_MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, STEP_TRIM_THRESHOLD)
    )


_frozen = {"loops": 0}  # loops inside loaded_objects_frozen, process-wide
_frozen_lock = threading.Lock()


@contextlib.contextmanager
def loaded_objects_frozen() -> Iterator[None]:
    """Collect, then keep every object alive now out of the cyclic collector until the block
    ends (``gc.freeze``, as vLLM does after start-up); the last block to end in the process
    hands them back (``gc.unfreeze``), so concurrent engine loops do not thaw each other.

    A loaded model brings millions of long-lived Python objects (torch, transformers, the
    tokenizer), and each full collection walks them all: replaying 96 requests of SmolLM2 at
    32 users, one stopped the engine for ~170 ms, a gap every stream saw. Frozen, they are
    not scanned again. For a process that has finished loading and now runs steps (the
    serving engine's loop).
    """
    with _frozen_lock:
        _frozen["loops"] += 1
        gc.collect()
        gc.freeze()
    try:
        yield
    finally:
        with _frozen_lock:
            _frozen["loops"] -= 1
            if _frozen["loops"] == 0:
                gc.unfreeze()
