"""GEMV/GEMM benchmark: tpp ``linear`` vs ``torch.nn.functional.linear``, cold weights.

Each case rotates over enough weight copies to exceed the last-level cache, so every call
streams its weight from DRAM. Torch and tpp are timed in alternating rounds; the figures are
the median per-call time over all rounds, and (``best``) the fastest call, which shows what an
unloaded machine gives when other processes share the cores. GB/s counts weight bytes;
GFLOP/s counts ``2*M*N*K``.

    python -m pace_tpp.bench [--threads 1,2] [--dtypes fp32,bf16] [--rounds 7] [--json out.json]
    python -m pace_tpp.bench --threads 1 --clock thread   # CPU time: robust to shared cores
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from pace_tpp import kernels

SHAPES = ((576, 1536), (2048, 8192), (4096, 4096))  # (K, N)
ROWS = (1, 8, 128)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
COLD_BYTES = 96 << 20  # 3x a 32 MiB L3
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
clock = time.perf_counter


def _per_call(fn, weights, x, calls: int) -> list[float]:
    times = []
    for i in range(calls):
        w = weights[i % len(weights)]
        start = clock()
        fn(x, w)
        times.append(clock() - start)
    return times


def bench_case(k: int, n: int, m: int, dtype: torch.dtype, rounds: int) -> dict:
    nbytes = n * k * dtype.itemsize
    copies = max(2, -(-COLD_BYTES // nbytes))
    raw = [torch.randn(n, k).to(dtype) for _ in range(copies)]
    packed = [kernels.prepare_linear(w) for w in raw]
    x = torch.randn(m, k).to(dtype)
    calls = max(2 * copies, 20)
    F.linear(x, raw[0]), kernels.linear(x, packed[0])  # warm-up (JIT, thread pool)
    t_torch, t_tpp = [], []
    for _ in range(rounds):
        t_torch += _per_call(F.linear, raw, x, calls)
        t_tpp += _per_call(kernels.linear, packed, x, calls)
    tt, tp = statistics.median(t_torch), statistics.median(t_tpp)
    flops = 2 * m * n * k
    return {
        "shape": f"[{m},{k}]x[{k},{n}]", "torch_us": tt * 1e6, "tpp_us": tp * 1e6,
        "torch_GBs": nbytes / tt / 1e9, "tpp_GBs": nbytes / tp / 1e9,
        "torch_GFLOPs": flops / tt / 1e9, "tpp_GFLOPs": flops / tp / 1e9, "speedup": tt / tp,
        "torch_best_GBs": nbytes / min(t_torch) / 1e9, "tpp_best_GBs": nbytes / min(t_tpp) / 1e9,
        "torch_best_GFLOPs": flops / min(t_torch) / 1e9,
        "tpp_best_GFLOPs": flops / min(t_tpp) / 1e9,
    }  # fmt: skip


def _line(r: dict) -> str:
    return (
        f"{r['threads']:>3} {r['dtype']:5} {r['shape']:24} {r['torch_GBs']:>10.1f} "
        f"{r['tpp_GBs']:>9.1f} {r['torch_GFLOPs']:>10.1f} {r['tpp_GFLOPs']:>9.1f} "
        f"{r['speedup']:>7.2f}  {r['torch_best_GBs']:.1f}/{r['tpp_best_GBs']:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--rows", default=",".join(map(str, ROWS)))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument(
        "--clock",
        choices=CLOCKS,
        default="wall",
        help="thread = CPU time of this thread (only meaningful with --threads 1)",
    )
    args = p.parse_args(argv)
    if args.clock == "thread" and args.threads != "1":
        p.error("--clock thread needs --threads 1 (other threads' time is not counted)")
    global clock
    clock = CLOCKS[args.clock]
    rows = []
    head = f"{'thr':>3} {'dtype':5} {'shape':24} {'torch GB/s':>10} {'tpp GB/s':>9} "
    print(head + f"{'torch GF/s':>10} {'tpp GF/s':>9} {'speedup':>7}  best torch/tpp GB/s")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for name in args.dtypes.split(","):
            for m in (int(r) for r in args.rows.split(",")):
                for k, n in SHAPES:
                    r = {"threads": threads, "dtype": name,
                         **bench_case(k, n, m, DTYPES[name], args.rounds)}  # fmt: skip
                    rows.append(r)
                    print(_line(r), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
