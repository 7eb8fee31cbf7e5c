"""Decode attention cost per cache type (native backend) vs context length and batch.

One layer with SmolLM2's shape (9 query heads, 3 KV heads, head_dim 64). For each cache type,
batch and context, times one decode step (write K/V for 1 token per sequence + attention) and
reports the median in µs per step, per-token cost and the cache memory in use.

    python benchmarks/attention.py --contexts 128 1024 8192 --batches 1 8 32
"""

from __future__ import annotations

import argparse
import time

import torch

from pace_core.bench.common import emit


def make_cache(kind: str, hk: int, d: int, dtype, tokens: int):
    from pace_core.caches.blocks import PagedCache, SlabPoolCache
    from pace_core.caches.contiguous import BMCCache, DynamicCache

    if kind == "dynamic":
        return DynamicCache([hk], [d], dtype)
    if kind == "bmc":
        return BMCCache([hk], [d], dtype, max_seq_len=tokens)
    cls = PagedCache if kind == "paged" else SlabPoolCache
    return cls([hk], [d], dtype, max_tokens=tokens)


def bench(kind, batch, context, hq, hk, d, dtype, repeats):
    from pace_native.kernels import attention

    cache = make_cache(kind, hk, d, dtype, batch * (context + 2048))
    ids = cache.add_sequences(batch)
    chunk = 512
    for start in range(0, context, chunk):  # fill in chunks
        n = min(chunk, context - start)
        kv = torch.randn(batch, hk, n, d, dtype=dtype)
        cache.begin_step(ids, [n] * batch, n)
        cache.update(0, kv, kv)
        cache.end_step()
    q = torch.randn(batch, hq, 1, d, dtype=dtype)
    k = torch.randn(batch, hk, 1, d, dtype=dtype)
    times = []
    for _ in range(repeats + 2):
        t0 = time.perf_counter()
        cache.begin_step(ids, [1] * batch, 1)
        attention(q, cache.update(0, k, k), d**-0.5)
        cache.end_step()
        times.append(time.perf_counter() - t0)
        for sid in ids:
            cache.crop(sid, 1)
    times = sorted(times[2:])
    med = times[len(times) // 2]
    return {
        "us_per_step": med * 1e6,
        "us_per_seq": med * 1e6 / batch,
        "memory_mb": cache.memory_used() / 2**20,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--caches", nargs="+", default=["dynamic", "bmc", "paged", "slab_pool"])
    p.add_argument("--contexts", nargs="+", type=int, default=[128, 1024, 4096, 8192])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    rows = []
    for batch in args.batches:
        for context in args.contexts:
            for kind in args.caches:
                r = bench(kind, batch, context, 9, 3, 64, dtype, args.repeats)
                rows.append({"cache": kind, "batch": batch, "context": context, **r})
    emit(
        "attention",
        rows,
        ["cache", "batch", "context", "us_per_step", "us_per_seq", "memory_mb"],
        args.out,
    )


if __name__ == "__main__":
    main()
