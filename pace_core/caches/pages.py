"""Memory of the block pools: their budget checked against the machine (:func:`check_budget`,
:func:`check_fits`), mapped lazily (:func:`lazy_zeros`), committed up front when the pool will
live as long as the process (:func:`populate`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import mmap
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from pace_core.errors import ConfigError
from pace_core.values import is_int, is_real

MADV_POPULATE_WRITE = 23  # Linux >= 5.14: fault pages in writable, contents untouched
# the memory limit of this process's cgroup: v2, then v1 ("max" or a huge number: none)
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def memory_limit() -> int:
    """Bytes of memory this process can have: the machine's physical memory, or its cgroup's
    limit when that is lower."""
    limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in CGROUP_LIMITS:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limit = min(limit, int(text))
    return limit


def check_budget(memory_gb: object, max_tokens: object) -> None:
    """ConfigError unless a KV pool budget is a number of GiB > 0 within this machine's
    memory, or a token count >= 1 (None: not given)."""
    if memory_gb is not None:
        if not (is_real(memory_gb) and memory_gb > 0):
            raise ConfigError(f"kv_cache_memory_gb must be a number > 0 (got {memory_gb!r})")
        check_fits(memory_gb * (1 << 30), f"kv_cache_memory_gb={memory_gb}")
    if max_tokens is not None and not (is_int(max_tokens) and max_tokens >= 1):
        raise ConfigError(f"max_cache_tokens must be a count >= 1 (got {max_tokens!r})")


def check_fits(nbytes: float, what: str) -> None:
    """ConfigError when a pool of ``nbytes`` (sized by ``what``) exceeds :func:`memory_limit`:
    the pool is mapped whole, so the OS would refuse it or swap."""
    limit = memory_limit()
    if nbytes > limit:
        raise ConfigError(
            f"{what} asks for a {nbytes / (1 << 30):.1f} GiB KV pool, more than the "
            f"{limit / (1 << 30):.1f} GiB of memory this machine (or its cgroup) has; "
            "lower it"
        )


def lazy_zeros(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor in a private anonymous mapping: the OS hands out zeroed pages on first
    touch, so a pool sized for the whole budget costs only the blocks that get used
    (``torch.zeros`` writes every byte up front: ~0.2 s per GB, paid by every new cache)."""
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if nbytes < mmap.PAGESIZE:
        return torch.zeros(tuple(shape), dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)  # MAP_ANONYMOUS: zero-filled
    return torch.frombuffer(buf, dtype=dtype).view(tuple(shape))  # keeps `buf` alive


@functools.cache
def _madvise():
    name = ctypes.util.find_library("c")
    fn = getattr(ctypes.CDLL(name), "madvise", None) if name else None
    if fn is not None:
        fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return fn


def populate(tensor: torch.Tensor) -> int:
    """Commit every page of a contiguous ``tensor`` now, writable, keeping its contents;
    returns the bytes committed.

    A lazily mapped page faults when a step first touches it, on the thread that runs the
    step, while the other threads wait at the next barrier. Worse, a page first *read* maps
    the shared zero page, and the write that follows faults again and flushes the TLB of
    every CPU running the process (an IPI each): in a 32-user SmolLM2 replay that was ~2.5%
    of the CPU time. ``madvise(MADV_POPULATE_WRITE)`` commits the pages in the kernel; where
    it is missing (Linux < 5.14), a read and write back of one element per page does.
    """
    if not tensor.is_contiguous():
        raise ValueError("populate needs a contiguous tensor")
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return 0
    page = mmap.PAGESIZE
    start = tensor.data_ptr() // page * page
    end = tensor.data_ptr() + nbytes
    fn = _madvise()
    if fn is not None and fn(start, end - start, MADV_POPULATE_WRITE) == 0:
        return nbytes
    flat = tensor.view(-1)
    step = max(1, page // tensor.element_size())
    flat[::step] = flat[::step].clone()
    flat[-1:] = flat[-1:].clone()  # the last page, when the tensor starts mid-page
    return nbytes
