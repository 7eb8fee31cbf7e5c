"""Whether a kernel call lets other Python threads run (releases the GIL)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import torch

MIN_CALL_SECONDS = 0.05


def longest_stall_inside(call: Callable[[], object]) -> tuple[float, float]:
    """(the call's duration, the longest time another Python thread could not run during it):
    that thread stamps the clock and yields, over and over, while ``call()`` runs on one
    intra-op thread (the other core is the stamping thread's)."""
    stamps: list[float] = []
    stop = threading.Event()

    def stamp() -> None:
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0)

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    stamper = threading.Thread(target=stamp, daemon=True)
    stamper.start()
    try:
        time.sleep(0.01)
        start = time.perf_counter()
        call()
        end = time.perf_counter()
    finally:
        stop.set()
        stamper.join()
        torch.set_num_threads(saved)
    inside = [start] + [s for s in stamps if start < s < end] + [end]
    return end - start, max(b - a for a, b in itertools.pairwise(inside))


def assert_runs_without_gil(call: Callable[[], object]) -> None:
    """Holding the GIL, the other thread stalls for the whole call; released, at most for a
    scheduler slice."""
    took, stall = longest_stall_inside(call)
    assert took >= MIN_CALL_SECONDS, f"the call took {took:.3f} s: too short to tell"
    assert stall < 0.4 * took, f"another thread stalled {stall:.3f} s of a {took:.3f} s call"
