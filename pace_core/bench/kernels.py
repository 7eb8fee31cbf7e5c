"""Kernel microbenchmarks: every linear backend side by side in one run, plus fused ops.

- DRAM reference: plain streaming reads of a bf16 tensor far larger than the L3, at each
  thread count: ``torch.sum`` and pace-avx512's ``stream_read`` (loads every 64-byte line
  once, 4 sequential streams per thread like the GEMV). GEMV results are also given as a
  share (``of_dram``) of the faster of the two.
- GEMV (decode, M = 1 and 8): GB/s of weight bytes streamed, cold weights: each call uses the
  next matrix of a set ~3x the L3, so the weights always come from DRAM.
- GEMM (prefill, M = 128 and 512): GFLOP/s (2*M*N*K per call).
- Decode ops of SmolLM2-135M (avx512 vs native, hot data): gated MLP, RMSNorm + residual,
  rope, attention over 512 cached tokens; microseconds per call.
- ``--sections model`` (not in the default set): a whole model (``--model``, default the zoo's
  SmolLM2-135M) on the native plan vs every op pace-avx512 serves: prefill time of a
  128-token prompt and decode tokens/s over 32 new tokens.

Backends: ``torch`` (F.linear on the [N, K] weight), ``mkldnn`` (oneDNN prepacked:
``torch.ops.mkldnn._reorder_linear_weight(w, M)`` + ``torch.ops.mkldnn._linear_pointwise``),
``native`` (pace-native), ``avx512`` (pace-avx512). The backends of one configuration are
timed round-robin (one run of each per round), so load from other processes hits them alike;
``value`` is the median of ``--repeats`` (>= 5) rounds and ``best`` the fastest round.
``--clock thread`` measures CPU time of the calling thread instead of wall time (1 thread
only): steadier on a shared machine, since time spent descheduled is not counted.

    python benchmarks/kernels.py                       # everything, ~5 minutes on 2 cores
    python benchmarks/kernels.py --dtypes bfloat16 --threads 2 --sections gemv
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

from pace_core.bench.common import emit

SHAPES = {"576x1536": (576, 1536), "2048x8192": (2048, 8192), "4096x4096": (4096, 4096)}  # K x N
COLD_BYTES = 96 << 20  # per weight set: 3x the 32 MiB L3 of the reference machine
BACKENDS = ("torch", "mkldnn", "native", "avx512")
SECTIONS = ("gemv", "gemm", "ops", "model")
AVX512_OPS = ("linear", "qkv_proj", "gated_mlp", "rms_norm", "rope", "attention")
COLUMNS = ["section", "dtype", "shape", "M", "threads", "backend", "value", "best", "unit",
           "vs_torch", "vs_native", "of_dram"]  # fmt: skip
Backend = tuple[Callable[[torch.Tensor, int], Any], Callable[[torch.Tensor, Any], torch.Tensor]]


def linear_backends(names: list[str]) -> dict[str, Backend]:
    """name -> (prepare(weight[N, K], m) -> packed, call(x, packed) -> y)."""
    out: dict[str, Backend] = {}
    if "torch" in names:
        out["torch"] = (lambda w, m: w, lambda x, w: F.linear(x, w))
    if "mkldnn" in names:
        out["mkldnn"] = (
            lambda w, m: torch.ops.mkldnn._reorder_linear_weight(w, m),
            lambda x, p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""),
        )
    if "native" in names:
        from pace_native import kernels as nk

        out["native"] = (lambda w, m: nk.prepare_linear(w), nk.linear)
    if "avx512" in names:
        from pace_avx512 import kernels as ak
        from pace_avx512 import packing

        out["avx512"] = (lambda w, m: packing.prepare_linear(w), ak.linear)
    return out


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int, clock) -> dict[str, list[float]]:
    """Seconds of each fn per round, timed round-robin after one warm-up call each."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return times


def add_rows(rows, times, rate, ref: str | None, **fields) -> dict[str, float]:
    """One row per backend: ``rate(seconds)`` of the median and of the best round."""
    med = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        row = {**fields, "backend": name, "value": rate(med[name]), "best": rate(min(t))}
        if ref in med:
            row["vs_torch" if ref == "torch" else "vs_native"] = med[ref] / med[name]
        rows.append(row)
    return med


def sweep(call, x, packed: list) -> Callable[[], None]:
    """One timed run: a call on each matrix of the set in turn (cold weights)."""

    def run():
        for p in packed:
            call(x, p)

    return run


def dram_read(args, threads: int, rows: list) -> float:
    """GB/s of plain streaming reads over 4 x COLD_BYTES of bf16; returns the best median."""
    big = torch.ones(4 * COLD_BYTES // 2, dtype=torch.bfloat16)
    fns: dict[str, Callable[[], Any]] = {"torch.sum": big.sum}
    if "avx512" in args.backends:
        from pace_avx512.build import load_extension

        fns["avx512.stream_read"] = partial(load_extension().stream_read, big)
    times = interleaved(fns, args.repeats, args.clock_fn)
    med = add_rows(rows, times, lambda s: big.nbytes / s / 1e9, None, section="dram-read",
                   dtype="bfloat16", shape="384MiB", threads=threads, unit="GB/s")  # fmt: skip
    return big.nbytes / min(med.values()) / 1e9


def bench_linear(args, dtype, threads, dram, rows) -> None:
    backends = linear_backends(args.backends)
    size = torch.finfo(dtype).bits // 8
    name = str(dtype).removeprefix("torch.")
    for shape in args.shapes:
        k, n = SHAPES[shape]
        count = max(3, -(-COLD_BYTES // (n * k * size)))
        gen = torch.Generator().manual_seed(0)
        weights = [(torch.randn(n, k, generator=gen) / k**0.5).to(dtype) for _ in range(count)]
        for section, ms in (("gemv", args.gemv_m), ("gemm", args.gemm_m)):
            if section not in args.sections:
                continue
            for m in ms:
                x = torch.randn(m, k, generator=gen).to(dtype)
                # GEMM is compute bound: two matrices are enough (and keep the run short).
                subset = weights if section == "gemv" else weights[:2]
                fns = {b: sweep(call, x, [prepare(w, m) for w in subset])
                       for b, (prepare, call) in backends.items()}  # fmt: skip
                times = interleaved(fns, args.repeats, args.clock_fn)
                del fns
                work = (n * k * size if section == "gemv" else 2 * m * n * k) * len(subset)
                unit = "GB/s" if section == "gemv" else "GFLOP/s"
                before = len(rows)
                add_rows(rows, times, lambda s, w=work: w / s / 1e9, "torch",
                         section=section, dtype=name, shape=shape, M=m, threads=threads,
                         unit=unit)  # fmt: skip
                if section == "gemv":
                    for row in rows[before:]:
                        row["of_dram"] = row["value"] / dram


def bench_ops(args, dtype, threads, rows) -> None:
    """Decode-size ops of SmolLM2-135M, avx512 vs native, hot data (dispatch + compute)."""
    from pace_avx512 import kernels as ak
    from pace_avx512 import packing
    from pace_native import kernels as nk

    gen = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
    h, i, heads, kv_heads, d, ctx = 576, 1536, 9, 3, 64, 512
    g, u, down = rand(i, h) / 24, rand(i, h) / 24, rand(h, i) / 40
    mlp = {"native": (nk.gated_mlp, nk.prepare_gated_mlp(g, u, down, "silu")),
           "avx512": (ak.gated_mlp, packing.prepare_gated_mlp(g, u, down, "silu"))}  # fmt: skip
    weight = torch.randn(h, generator=gen)
    cases = []
    for m in (1, 8):
        x = rand(m, h)
        fns = {b: partial(f, x, w) for b, (f, w) in mlp.items()}
        cases.append(("gated_mlp", f"{h}x{i}", m, fns))
    for m in (1, 512):
        x, res = rand(m, h), rand(m, h)
        fns = {"native": partial(nk.rms_norm, x, weight, 1e-6, res),
               "avx512": partial(ak.rms_norm, x, weight, 1e-6, res)}  # fmt: skip
        cases.append(("rms_norm+res", f"{m}x{h}", m, fns))
    qkv = rand(1, 1, (heads + 2 * kv_heads) * d)
    q, k = qkv[..., : heads * d].view(1, 1, heads, d), qkv[..., heads * d :].view(1, 1, -1, d)
    angles = torch.rand(1, 1, d, generator=gen)  # a true rotation: in place stays bounded
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    impls = (("native", nk), ("avx512", ak))
    fns = {b: partial(f.rope, q, k[:, :, :kv_heads], cos, sin, False) for b, f in impls}
    cases.append(("rope", f"{heads}+{kv_heads}x{d}", 1, fns))
    mask = torch.ones(1, 1, 1, ctx, dtype=torch.bool)
    meta = SimpleNamespace(mask=lambda window: mask)
    kv = SimpleNamespace(keys=rand(1, kv_heads, ctx, d), values=rand(1, kv_heads, ctx, d),
                         layout="contiguous", meta=meta)  # fmt: skip
    qa = rand(1, heads, 1, d)
    fns = {b: partial(f.attention, qa, kv, d**-0.5) for b, f in impls}
    cases.append(("attention", f"{heads}/{kv_heads}x{d} S={ctx}", 1, fns))
    for section, shape, m, fns in cases:
        times = interleaved(fns, args.repeats * 20, args.clock_fn)
        add_rows(rows, times, lambda s: s * 1e6, "native", section=section,
                 dtype=str(dtype).removeprefix("torch."), shape=shape, M=m, threads=threads,
                 unit="us")  # fmt: skip


def bench_model(args, dtype, threads, rows) -> None:
    """Prefill (128 tokens) and decode (32 tokens) of a whole model, native vs avx512 plan."""
    from pace_core import LLMModel, SamplingConfig, zoo

    path = zoo.pull(args.model, quiet=True) if zoo.is_zoo_name(args.model) else args.model
    plans = {"native": {"default": "native"},
             "avx512": {**dict.fromkeys(AVX512_OPS, "avx512"), "default": "native",
                        "strict": True}}  # fmt: skip
    models = {name: LLMModel(path, dtype=dtype, opconfig=plan) for name, plan in plans.items()}
    ids = torch.randint(100, 5000, (1, 128), generator=torch.Generator().manual_seed(0))
    steps = {n: SamplingConfig(max_new_tokens=n, min_new_tokens=n) for n in (1, 33)}
    fns = {f"{name}/{n}": partial(model.generate, ids, cfg)
           for name, model in models.items() for n, cfg in steps.items()}  # fmt: skip
    times = interleaved(fns, args.repeats, args.clock_fn)
    med = {k: statistics.median(v) for k, v in times.items()}
    for name in models:
        prefill, total = med[f"{name}/1"], med[f"{name}/33"]
        fields = {"dtype": str(dtype).removeprefix("torch."), "shape": str(args.model),
                  "threads": threads, "backend": name}  # fmt: skip
        rows.append({**fields, "section": "model-prefill", "M": 128, "value": prefill * 1e3,
                     "unit": "ms", "vs_native": med["native/1"] / prefill})  # fmt: skip
        decode = 32 / (total - prefill)
        native = 32 / (med["native/33"] - med["native/1"])
        rows.append({**fields, "section": "model-decode", "M": 1, "value": decode,
                     "unit": "tok/s", "vs_native": decode / native})  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    p.add_argument("--sections", nargs="+", default=list(SECTIONS[:3]), choices=SECTIONS)
    p.add_argument("--model", default="smollm2", help="zoo name or path (--sections model)")
    p.add_argument("--gemv-m", nargs="+", type=int, default=[1, 8])
    p.add_argument("--gemm-m", nargs="+", type=int, default=[128, 512])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--clock", default="wall", choices=["wall", "thread"])
    p.add_argument("--out", default=None, help="directory for the JSON result")
    args = p.parse_args()
    if args.repeats < 5:
        p.error("--repeats must be >= 5 (medians)")
    if args.clock == "thread" and args.threads != [1]:
        p.error("--clock thread measures one thread: use it with --threads 1")
    args.clock_fn = time.thread_time if args.clock == "thread" else time.perf_counter
    if "avx512" in args.backends:  # compile (or load) before timing anything
        from pace_avx512.build import load_extension

        load_extension()
    rows: list[dict[str, Any]] = []
    with torch.inference_mode():
        for threads in args.threads:
            torch.set_num_threads(threads)
            dram = dram_read(args, threads, rows)
            for name in args.dtypes:
                dtype = getattr(torch, name)
                bench_linear(args, dtype, threads, dram, rows)
                if "ops" in args.sections and "avx512" in args.backends:
                    bench_ops(args, dtype, threads, rows)
                if "model" in args.sections:
                    bench_model(args, dtype, threads, rows)
    emit("kernels", rows, COLUMNS, args.out)


if __name__ == "__main__":
    main()
