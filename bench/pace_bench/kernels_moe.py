"""The ``moe`` section of ``pace bench kernels``: op ``moe`` per backend at real expert shapes.

Experts of Qwen3-30B-A3B's shape (128 experts, hidden 2048, intermediate 768, top-8; 1.2 GB
in bf16, so every call reads its experts from DRAM) with M = 1 (decode), 8 (batched decode)
and 128 (a prefill chunk) tokens routed at random; each backend's prepared experts, timed
round-robin. native is the per-expert loop of torch matmuls over the hit experts.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from pace_bench.common import (
    add_rows,
    dtype_name,
    interleaved,
    keep_backend,
    progress,
    usable_kernels,
)

EXPERTS, HIDDEN, INTER, TOP_K = 128, 2048, 768, 8
TOKENS = (1, 8, 128)


def bench_moe(args: Any, dtype: torch.dtype, threads: int, rows: list) -> None:
    """µs per call per backend (``vs_native``: speed-up over the per-expert torch loop), and
    the GB/s of the hit experts' weights."""
    gen = torch.Generator().manual_seed(0)
    attrs = {"experts": EXPERTS, "top_k": TOP_K, "activation": "silu", "biases": False}
    usable = {
        b: s for b, s in usable_kernels("moe", dtype, **attrs).items()
        if keep_backend(args.backends, b)
    }  # fmt: skip
    gate_up = (torch.randn(EXPERTS, HIDDEN, 2 * INTER, generator=gen) / 45).to(dtype)
    down = (torch.randn(EXPERTS, INTER, HIDDEN, generator=gen) / 28).to(dtype)
    packed = {b: s.prepare(gate_up, None, down, None, 1.0, 0.0, "silu") for b, s in usable.items()}
    del gate_up, down
    expert_bytes = 3 * HIDDEN * INTER * torch.empty(0, dtype=dtype).element_size()
    for m in progress(TOKENS, f"moe {dtype_name(dtype)} t={threads}", args.quiet):
        x = torch.randn(m, HIDDEN, generator=gen).to(dtype)
        chosen = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(m)])
        weights = torch.softmax(torch.randn(m, TOP_K, generator=gen), -1)
        fns = {b: partial(s.fn, x, chosen, weights, packed[b]) for b, s in usable.items()}
        times = interleaved(fns, args.repeats * 5, args.clock_fn)
        before, hit = len(rows), int(chosen.unique().numel())
        add_rows(rows, times, lambda s: s * 1e6, "native", section="moe",
                 dtype=dtype_name(dtype), shape=f"{EXPERTS}x{HIDDEN}x{INTER} top{TOP_K}", M=m,
                 threads=threads, unit="us", experts_hit=hit)  # fmt: skip
        for row in rows[before:]:
            row["weight_gbs"] = hit * expert_bytes / (row["value"] * 1e-6) / 1e9
