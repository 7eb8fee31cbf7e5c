"""Kernel tests at a given thread count, every thread taking part however small the work."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def every_thread(ext, threads: int) -> Iterator[None]:
    """``threads`` threads for pace-avx512's extension ``ext``, with no minimum work per
    thread; both restored after."""
    before = torch.get_num_threads(), ext.min_work_per_thread()
    torch.set_num_threads(threads)
    ext.set_min_work_per_thread(1)
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        ext.set_min_work_per_thread(before[1])
