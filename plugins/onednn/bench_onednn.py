"""Side-by-side GEMV/GEMM and gated-MLP timings: pace-onednn vs torch (F.linear, native MLP).

Weights are cold: each timed call uses the next of enough copies to exceed 3x L3. Backends
alternate within every round; the reported number is the median over rounds.

    .venv/bin/python plugins/onednn/bench_onednn.py [--threads 1 2] [--rounds 7]
    .venv/bin/python plugins/onednn/bench_onednn.py --threads 1 --clock thread
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from pace_native import kernels as native
from pace_onednn import kernels as onednn
from pace_onednn.build import extension

COLD_BYTES = 3 * 32 * 2**20 + 64 * 2**20  # 3x L3 (32 MiB) plus margin
LINEAR = ((576, 1536), (2048, 8192), (4096, 4096))
MLP = ((576, 1536), (2048, 5632))  # SmolLM2-135M, TinyLlama-1.1B (hidden, intermediate)


def copies(nbytes: int) -> int:
    return max(2, -(-COLD_BYTES // nbytes))


CLOCK = time.perf_counter


def timed(fns: dict[str, Callable[[int], object]], calls: int, rounds: int) -> dict[str, float]:
    """Median seconds per call of each ``fn(i)``, backends interleaved round by round."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm-up: primitive creation, page faults
        for i in range(calls):
            fn(i)
    for _ in range(rounds):
        for name, fn in fns.items():
            t = CLOCK()
            for i in range(calls):
                fn(i)
            samples[name].append((CLOCK() - t) / calls)
    return {name: statistics.median(s) for name, s in samples.items()}


def bench_linear(dtype: torch.dtype, rounds: int) -> list[str]:
    rows = []
    for k, n in LINEAR:
        nbytes = k * n * dtype.itemsize
        c = copies(nbytes)
        ws = [torch.randn(n, k).div_(k**0.5).to(dtype) for _ in range(c)]
        packed = [onednn.prepare_linear(w) for w in ws]
        for m in (1, 8, 128):
            x = torch.randn(m, k).to(dtype)
            t = timed({
                "torch": lambda i, x=x, ws=ws: F.linear(x, ws[i % len(ws)]),
                "onednn": lambda i, x=x, ps=packed: onednn.linear(x, ps[i % len(ps)]),
            }, calls=2 * c, rounds=rounds)  # fmt: skip
            if m == 128:
                unit, work = "GFLOP/s", 2 * m * k * n / 1e9
            else:
                unit, work = "GB/s", (nbytes + m * (k + n) * dtype.itemsize) / 1e9
            rows.append(
                f"linear [{m},{k}]x[{k},{n}] {unit}: torch {work / t['torch']:.1f}  "
                f"onednn {work / t['onednn']:.1f}  ({packed[0].impl(m)})"
            )
    return rows


def bench_mlp(dtype: torch.dtype, rounds: int) -> list[str]:
    rows = []
    for h, inter in MLP:
        nbytes = 3 * h * inter * dtype.itemsize
        c = copies(nbytes)
        shapes = ((inter, h), (inter, h), (h, inter))
        mats = [[torch.randn(s).div_(s[1] ** 0.5).to(dtype) for s in shapes] for _ in range(c)]
        nat = [native.prepare_gated_mlp(*m, "silu") for m in mats]
        dnn = [onednn.prepare_gated_mlp(*m, "silu") for m in mats]
        del mats
        for m in (1, 8):
            x = torch.randn(m, h).to(dtype)
            t = timed({
                "native": lambda i, x=x, ws=nat: native.gated_mlp(x, ws[i % len(ws)]),
                "onednn": lambda i, x=x, ws=dnn: onednn.gated_mlp(x, ws[i % len(ws)]),
            }, calls=2 * c, rounds=rounds)  # fmt: skip
            gbs = {name: nbytes / 1e9 / sec for name, sec in t.items()}
            rows.append(f"gated_mlp silu M={m} H={h} I={inter} GB/s: "
                        f"native {gbs['native']:.1f}  onednn {gbs['onednn']:.1f}")  # fmt: skip
    return rows


def bench_overhead(rounds: int) -> str:
    """Per-call time of a tiny fp32 [1,64]x[64,64] (cache-resident): pure call overhead."""
    w = torch.randn(64, 64)
    x = torch.randn(1, 64)
    p = onednn.prepare_linear(w)
    t = timed({"torch": lambda i: F.linear(x, w), "onednn": lambda i: onednn.linear(x, p)},
              calls=2000, rounds=rounds)  # fmt: skip
    us = {name: sec * 1e6 for name, sec in t.items()}
    return f"call overhead [1,64]x[64,64] us: torch {us['torch']:.1f}  onednn {us['onednn']:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--skip-mlp", action="store_true")
    ap.add_argument(
        "--clock",
        choices=["wall", "thread"],
        default="wall",
        help="thread: CPU time of this thread (1 thread only; steadier when shared)",
    )
    args = ap.parse_args()
    if args.clock == "thread":
        if args.threads != [1]:
            ap.error("--clock thread needs --threads 1")
        global CLOCK
        CLOCK = time.thread_time
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"oneDNN {extension().version()}, torch {torch.__version__}, load average {load}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(f"\n== {threads} thread(s), {args.clock} clock, median of {args.rounds} rounds ==")
        print(bench_overhead(args.rounds))
        for dtype in (torch.bfloat16, torch.float32):
            print(f"-- {str(dtype).removeprefix('torch.')}")
            rows = bench_linear(dtype, args.rounds)
            if not args.skip_mlp:
                rows += bench_mlp(dtype, args.rounds)
            print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main()
