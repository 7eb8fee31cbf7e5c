"""One OpenMP team per serving process: model loading runs on a thread that ends.

libgomp gives every thread that starts a parallel region its own team of worker threads, kept
for the life of that thread. Once it manages more threads than the process has CPUs, a worker
waiting for the next parallel region spins 100 times instead of ~300,000
(``gomp_throttled_spin_count``) and then sleeps on a futex, so each of the ~200 parallel
regions of a decode step pays for a wake-up. A model loaded on the main thread leaves such a
team behind, and the engine thread started afterwards then decoded SmolLM2 bf16 at 14.3-15.2
ms per token instead of 10.1 (2 threads; ``GOMP_SPINCOUNT`` does not raise the throttled
count, ``OMP_WAIT_POLICY=ACTIVE`` makes the idle team spin and is slower still). Loading on a
thread that ends takes its team with it: 10.9 ms.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def on_transient_thread(fn: Callable[[], T], name: str = "pace-load") -> T:
    """``fn()`` on a new thread that ends when it returns (or raises, re-raised here), so the
    OpenMP team its parallel regions created goes with it; use it for the OpenMP work a
    serving process does before its engine thread starts (loading the model)."""
    result: list[T] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # handed to the caller
            error.append(exc)

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
