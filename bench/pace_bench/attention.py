"""Decode attention cost per KV cache type (native backend) vs context length and batch.

One layer with SmolLM2's shape (9 query heads, 3 KV heads, head_dim 64). For each cache type,
batch and context, times one decode step (write K/V for 1 token per sequence + attention) and
reports the median in µs per step, per-token cost and the cache memory in use.

    pace bench attention --contexts 128 1024 8192 --batches 1 8 32
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from typing import Any

import torch

from pace_bench.common import emit, progress
from pace_core.arg_types import at_least

CACHES = ("dynamic", "bmc", "paged", "slab_pool")
COLUMNS = ["cache", "batch", "context", "us_per_step", "us_per_seq", "memory_mb"]
QUICK = {"contexts": [128, 1024], "batches": [1, 8], "repeats": 5}
HEADS, KV_HEADS, D = 9, 3, 64


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--caches", nargs="+", default=list(CACHES), choices=CACHES)
    p.add_argument("--contexts", nargs="+", type=at_least(1), default=[128, 1024, 4096, 8192])
    p.add_argument("--batches", nargs="+", type=at_least(1), default=[1, 8, 32])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=at_least(1), default=2)
    p.add_argument("--repeats", type=at_least(1), default=7)


def make_cache(kind: str, hk: int, d: int, dtype: torch.dtype, tokens: int) -> Any:
    from pace_core.caches.blocks import PagedCache, SlabPoolCache
    from pace_core.caches.contiguous import BMCCache, DynamicCache

    if kind == "dynamic":
        return DynamicCache([hk], [d], dtype)
    if kind == "bmc":
        return BMCCache([hk], [d], dtype, max_seq_len=tokens)
    cls = PagedCache if kind == "paged" else SlabPoolCache
    return cls([hk], [d], dtype, max_tokens=tokens)


def bench(kind: str, batch: int, context: int, dtype: torch.dtype, repeats: int) -> dict:
    """One decode step over ``context`` cached tokens per sequence: median µs and memory."""
    from pace_native.kernels import attention

    cache = make_cache(kind, KV_HEADS, D, dtype, batch * (context + 2048))
    ids = cache.add_sequences(batch)
    chunk = 512
    for start in range(0, context, chunk):  # fill in chunks
        n = min(chunk, context - start)
        kv = torch.randn(batch, KV_HEADS, n, D, dtype=dtype)
        cache.begin_step(ids, [n] * batch, n)
        cache.update(0, kv, kv)
        cache.end_step()
    q = torch.randn(batch, HEADS, 1, D, dtype=dtype)
    k = torch.randn(batch, KV_HEADS, 1, D, dtype=dtype)
    times = []
    for _ in range(repeats + 2):
        t0 = time.perf_counter()
        cache.begin_step(ids, [1] * batch, 1)
        attention(q, cache.update(0, k, k), D**-0.5)
        cache.end_step()
        times.append(time.perf_counter() - t0)
        for sid in ids:
            cache.crop(sid, 1)
    med = statistics.median(times[2:])
    return {
        "us_per_step": med * 1e6,
        "us_per_seq": med * 1e6 / batch,
        "memory_mb": cache.memory_used() / 2**20,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every (batch, context, cache) point; returns the JSON payload."""
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    rows = []
    points = list(itertools.product(args.batches, args.contexts, args.caches))
    for batch, context, kind in progress(points, "attention", args.quiet):
        r = bench(kind, batch, context, dtype, args.repeats)
        rows.append({"cache": kind, "batch": batch, "context": context, **r})
    return emit("attention", rows, COLUMNS, args)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench attention [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("attention", argv)
