"""Kernel microbenchmarks: every backend the resolver can use here, side by side in one run.

Backends come from the plugin registry (``pace ops`` lists them): every kernel registered for
an op whose CPU features, dtypes and ``supports`` predicate accept it on this machine, plus
two references for ``linear``: ``torch`` (F.linear on the [N, K] weight) and ``mkldnn``
(oneDNN prepacked through torch: ``torch.ops.mkldnn._reorder_linear_weight(w, M)`` +
``_linear_pointwise``). ``--backends`` keeps a subset.

- DRAM reference (``dram-read``): streaming reads of a bf16 tensor 4x ``--cold-mib``, at each
  thread count: ``torch.sum`` and pace-avx512's ``stream_read`` when installed. GEMV rows give
  their share (``of_dram``) of the faster one.
- GEMV (decode, ``--gemv-m``): GB/s of weight bytes, cold weights: each call uses the next
  matrix of a set of ``--cold-mib`` (default 3x the reference machine's L3).
- GEMM (prefill, ``--gemm-m``): GFLOP/s (2*M*N*K per call).
- ops: decode-size ``gated_mlp``, ``rms_norm`` (+ residual), ``rope`` and ``attention`` (512
  cached keys: contiguous, paged, paged int8 KV) at SmolLM2-135M sizes, hot data, every
  usable backend; microseconds per call.
- mlp (not in the default set): decode ``gated_mlp`` (silu, ``--gemv-m``) with cold weights at
  SmolLM2-135M (576x1536) and TinyLlama-1.1B (2048x5632) sizes: GB/s of the three matrices,
  like GEMV, since a decode MLP streams its weights from DRAM.
- moe (not in the default set): op ``moe`` per backend at Qwen3-30B-A3B's expert shapes
  (128 x 2048 x 768, top-8; cold) for 1, 8 and 128 routed tokens (``vs_native``: over the
  per-expert torch loop), with the hit experts' weight GB/s.
- qgemv (not in the default set): decode GEMVs over quantized weights (``int8``, ``int4``,
  ``q8_0``, ``q4_0``), cold, GB/s of the format's bytes and their ``of_dram`` share
  (:mod:`pace_bench.kernels_quant`).
- qgemm (not in the default set): prefill-size GEMMs (``--gemm-m``) of each backend's
  ``linear`` on the dense weight and on its quantizations (``--qgemm-formats``: W8A8 by
  default, GGUF formats too), GFLOP/s and ``vs_dense``.
- model (not in the default set): a whole model (``--model``) per backend plan:
  ``{"default": "native"}``, every op of each installed backend on it, and ``auto``; prefill
  time of a ``--model-prompt``-token prompt and decode tok/s over ``--model-tokens`` tokens.

The backends of one configuration are timed round-robin (one call of each per round), so load
from other processes hits them alike; ``value`` is the median of ``--repeats`` rounds and
``best`` the fastest. ``--clock thread`` measures CPU time of the calling thread (1 thread
only): steadier on a shared machine, as time spent descheduled is not counted.

    pace bench kernels                                  # everything, ~5 minutes on 2 cores
    pace bench kernels --dtypes bfloat16 --threads 2 --sections gemv
    pace bench kernels --shapes 64x128 --cold-mib 1 --repeats 1     # smoke test
    pace bench kernels --sections qgemv --shapes 576x49152 4096x4096 --gemv-m 1 --cold-mib 512
    pace bench kernels --sections qgemm --dtypes bfloat16 --threads 1 2 --gemm-m 32 128 512
    pace bench kernels --sections qgemm --qgemm-paths --dtypes bfloat16 --threads 2 \
        --backends avx512 --qgemm-formats q8_0 q4_k q6_k --shapes 2048x8192 --gemm-m 8 32 128
    PACE_QUANT_ACTIVATIONS=int8 pace bench kernels --sections qgemm --dtypes bfloat16 \
        --threads 1 --backends avx512 --qgemm-formats q8_0 q4_k q6_k q4_0
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

from pace_bench.common import (
    add_rows,
    dtype_name,
    emit,
    interleaved,
    keep_backend,
    note,
    parse_shape,
    progress,
    read_buffer,
    stream_read_fn,
    sweep,
    usable_kernels,
    warn,
)
from pace_bench.kernels_model import bench_model
from pace_bench.kernels_moe import bench_moe
from pace_bench.kernels_quant import QGEMM_FORMATS, bench_qgemm, bench_qgemv
from pace_core.arg_types import at_least
from pace_core.errors import ConfigError
from pace_core.plugins import get_host
from pace_core.registry import backends

SHAPES = {"576x1536": (576, 1536), "2048x8192": (2048, 8192), "4096x4096": (4096, 4096)}  # K x N
REFERENCES = ("torch", "mkldnn")
SECTIONS = ("gemv", "gemm", "ops", "mlp", "model", "moe", "qgemv", "qgemm")
COLUMNS = [
    "section",
    "dtype",
    "shape",
    "M",
    "threads",
    "backend",
    "value",
    "best",
    "unit",
    "vs_torch",
    "vs_native",
    "of_dram",
    "vs_dense",
]
QUICK = {
    "dtypes": ["bfloat16"],
    "threads": [1],
    "shapes": ["576x1536"],
    "gemv_m": [1],
    "gemm_m": [128],
    "repeats": 5,
    "cold_mib": 32,
}
# SmolLM2-135M decode sizes: hidden, intermediate, heads, KV heads, head dim, cached keys.
HIDDEN, INTER, HEADS, KV_HEADS, D, CTX = 576, 1536, 9, 3, 64, 512
# Gated MLPs of the mlp section (hidden x intermediate): SmolLM2-135M and TinyLlama-1.1B.
MLP_SHAPES = {"576x1536": (576, 1536), "2048x5632": (2048, 5632)}


@dataclass(frozen=True)
class LinearImpl:
    """``prepare(weight[N, K], m) -> packed`` once, then ``call(x, packed) -> y``."""

    prepare: Callable[[torch.Tensor, int], Any]
    call: Callable[[torch.Tensor, Any], torch.Tensor]


def shape_arg(text: str) -> str:
    """argparse type of ``--shapes``: checks ``KxN`` and keeps the text as the row label."""
    parse_shape(text)
    return text


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"]
    )
    p.add_argument("--threads", nargs="+", type=at_least(1), default=[1, 2])
    p.add_argument(
        "--shapes",
        nargs="+",
        type=shape_arg,
        default=list(SHAPES),
        help="K x N weight shapes, e.g. 576x1536",
    )
    p.add_argument(
        "--backends",
        nargs="+",
        default=None,
        help="keep these backends (default: every usable one, plus torch, mkldnn)",
    )
    p.add_argument("--sections", nargs="+", default=list(SECTIONS[:3]), choices=SECTIONS)
    p.add_argument("--gemv-m", nargs="+", type=at_least(1), default=[1, 8])
    p.add_argument("--gemm-m", nargs="+", type=at_least(1), default=[128, 512])
    p.add_argument(
        "--qgemm-formats",
        nargs="+",
        default=["w8a8"],
        choices=QGEMM_FORMATS,
        help="quantizations the qgemm section times against the dense weight",
    )
    p.add_argument(
        "--qgemm-paths",
        action="store_true",
        help="qgemm: also time pace-avx512's bf16-row paths forced (panel, words, planes)",
    )
    p.add_argument(
        "--cold-mib", type=at_least(1), default=96, help="weight set size per GEMV shape"
    )
    p.add_argument("--model", default="smollm2", help="zoo name or path (--sections model)")
    p.add_argument("--model-prompt", type=at_least(1), default=128, help="prompt tokens (model)")
    p.add_argument("--model-tokens", type=at_least(1), default=32, help="decoded tokens (model)")
    p.add_argument("--repeats", type=at_least(1), default=7)
    p.add_argument("--clock", default="wall", choices=["wall", "thread"])


# -- backends from the registry ---------------------------------------------------------------
def reference_linears(dtype: torch.dtype) -> dict[str, LinearImpl]:
    """``torch`` F.linear and, where torch has oneDNN, ``mkldnn`` prepacked weights."""
    out = {"torch": LinearImpl(lambda w, m: w, lambda x, w: F.linear(x, w))}
    bf16_ok = dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if torch.backends.mkldnn.is_available() and bf16_ok:
        out["mkldnn"] = LinearImpl(
            lambda w, m: torch.ops.mkldnn._reorder_linear_weight(w, m),
            lambda x, p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""),
        )
    return out


def linear_impls(dtype: torch.dtype, k: int, n: int, names: list[str] | None) -> dict:
    """References + every usable registered ``linear`` kernel, filtered by ``names``."""
    impls = reference_linears(dtype)
    for backend, spec in usable_kernels("linear", dtype, in_features=k, out_features=n).items():
        impls[backend] = LinearImpl(lambda w, m, s=spec: s.prepare(w, None), spec.fn)
    return {b: impl for b, impl in impls.items() if keep_backend(names, b)}


# -- measurement ------------------------------------------------------------------------------
def dram_read(args, threads: int, rows: list) -> float:
    """GB/s of plain streaming reads over 4 x ``--cold-mib`` of bf16; the best median."""
    big = torch.ones(4 * (args.cold_mib << 20) // 2, dtype=torch.bfloat16)
    fns: dict[str, Callable[[], Any]] = {"torch.sum": big.sum}
    stream = stream_read_fn()
    if stream is not None:
        fns["avx512.stream_read"] = partial(stream, read_buffer(big.nbytes))
    times = interleaved(fns, args.repeats, args.clock_fn)
    med = add_rows(
        rows,
        times,
        lambda s: big.nbytes / s / 1e9,
        None,
        section="dram-read",
        dtype="bfloat16",
        shape=f"{big.nbytes >> 20}MiB",
        threads=threads,
        unit="GB/s",
    )
    return big.nbytes / min(med.values()) / 1e9


def bench_linear(args, dtype: torch.dtype, threads: int, dram: float, rows: list) -> None:
    """GEMV and GEMM rows of every linear backend for every shape and M."""
    size = torch.finfo(dtype).bits // 8
    cases = [
        (shape, section, m)
        for shape in args.shapes
        for section, ms in (("gemv", args.gemv_m), ("gemm", args.gemm_m))
        if section in args.sections
        for m in ms
    ]
    weights: dict[str, list[torch.Tensor]] = {}
    for shape, section, m in progress(cases, f"linear {dtype_name(dtype)} t={threads}", args.quiet):
        k, n = parse_shape(shape)
        gen = torch.Generator().manual_seed(0)
        if shape not in weights:
            count = max(3, -(-(args.cold_mib << 20) // (n * k * size)))
            weights = {
                shape: [(torch.randn(n, k, generator=gen) / k**0.5).to(dtype) for _ in range(count)]
            }
        x = torch.randn(m, k, generator=gen).to(dtype)
        # GEMM is compute bound: two matrices are enough (and keep the run short).
        subset = weights[shape] if section == "gemv" else weights[shape][:2]
        impls = linear_impls(dtype, k, n, args.backends)
        fns = {
            b: sweep(impl.call, x, [impl.prepare(w, m) for w in subset])
            for b, impl in impls.items()
        }
        times = interleaved(fns, args.repeats, args.clock_fn)
        del fns
        work = (n * k * size if section == "gemv" else 2 * m * n * k) * len(subset)
        before = len(rows)
        add_rows(
            rows,
            times,
            lambda s, w=work: w / s / 1e9,
            "torch",
            section=section,
            dtype=dtype_name(dtype),
            shape=shape,
            M=m,
            threads=threads,
            unit="GB/s" if section == "gemv" else "GFLOP/s",
        )
        if section == "gemv":
            for row in rows[before:]:
                row["of_dram"] = row["value"] / dram


def op_cases(dtype: torch.dtype, names: list[str] | None) -> list[tuple[str, str, int, dict]]:
    """(op, shape label, M, backend -> fn) for the decode-size ops, every usable backend."""
    gen = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731

    def kernels(op: str, **attrs: Any) -> dict[str, Any]:
        usable = usable_kernels(op, dtype, **attrs)
        return {b: s for b, s in usable.items() if keep_backend(names, b)}

    cases = []
    g, u, down = rand(INTER, HIDDEN) / 24, rand(INTER, HIDDEN) / 24, rand(HIDDEN, INTER) / 40
    mlp = kernels("gated_mlp", activation="silu", hidden=HIDDEN, intermediate=INTER)
    packed = {b: s.prepare(g, u, down, "silu") for b, s in mlp.items()}
    for m in (1, 8):
        x = rand(m, HIDDEN)
        cases.append(
            (
                "gated_mlp",
                f"{HIDDEN}x{INTER}",
                m,
                {b: partial(s.fn, x, packed[b]) for b, s in mlp.items()},
            )
        )
    weight = torch.randn(HIDDEN, generator=gen)
    for m in (1, 512):
        x, res = rand(m, HIDDEN), rand(m, HIDDEN)
        cases.append(
            (
                "rms_norm+res",
                f"{m}x{HIDDEN}",
                m,
                {b: partial(s.fn, x, weight, 1e-6, res) for b, s in kernels("rms_norm").items()},
            )
        )
    qkv = rand(1, 1, (HEADS + 2 * KV_HEADS) * D)
    q, k = qkv[..., : HEADS * D].view(1, 1, HEADS, D), qkv[..., HEADS * D :].view(1, 1, -1, D)
    angles = torch.rand(1, 1, D, generator=gen)  # a true rotation: in place stays bounded
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    cases.append(
        (
            "rope",
            f"{HEADS}+{KV_HEADS}x{D}",
            1,
            {
                b: partial(s.fn, q, k[:, :, :KV_HEADS], cos, sin, False)
                for b, s in kernels("rope").items()
            },
        )
    )
    mask = torch.ones(1, 1, 1, CTX, dtype=torch.bool)
    kv = SimpleNamespace(
        keys=rand(1, KV_HEADS, CTX, D),
        values=rand(1, KV_HEADS, CTX, D),
        layout="contiguous",
        meta=SimpleNamespace(mask=lambda window: mask),
    )
    qa = rand(1, HEADS, 1, D)
    cases.append(
        (
            "attention",
            f"{HEADS}/{KV_HEADS}x{D} S={CTX}",
            1,
            {
                b: partial(s.fn, qa, kv, D**-0.5)
                for b, s in kernels("attention", cache_layout="contiguous").items()
            },
        )
    )
    for kv in ("auto", "int8"):  # a paged pool in the model dtype, and int8 KV rows
        attrs = {"cache_layout": "paged"} | ({"kv_dtype": kv} if kv != "auto" else {})
        view = paged_decode_view(rand, kv)
        label = f"{HEADS}/{KV_HEADS}x{D} S={CTX} paged" + (" int8" if kv != "auto" else "")
        specs = kernels("attention", **attrs)
        cases.append(
            ("attention", label, 1, {b: partial(s.fn, qa, view, D**-0.5) for b, s in specs.items()})
        )
    return cases


def paged_decode_view(rand: Callable[..., torch.Tensor], kv_dtype: str) -> Any:
    """A decode step's view of one sequence of ``CTX`` tokens in a paged cache."""
    from pace_core.caches.blocks import PagedCache

    dtype = rand(1).dtype
    cache = PagedCache([KV_HEADS], [D], dtype, max_tokens=2 * CTX, kv_dtype=kv_dtype)
    (sid,) = cache.add_sequences(1)
    cache.begin_step([sid], [CTX - 1], CTX - 1)
    cache.update(0, rand(1, KV_HEADS, CTX - 1, D), rand(1, KV_HEADS, CTX - 1, D))
    cache.end_step()
    cache.begin_step([sid], [1], 1)
    return cache.update(0, rand(1, KV_HEADS, 1, D), rand(1, KV_HEADS, 1, D))


def bench_ops(args, dtype: torch.dtype, threads: int, rows: list) -> None:
    """Decode-size ops, every usable backend, hot data (dispatch + compute), µs per call."""
    for op, shape, m, fns in progress(
        op_cases(dtype, args.backends), f"ops {dtype_name(dtype)} t={threads}", args.quiet
    ):
        times = interleaved(fns, args.repeats * 20, args.clock_fn)
        add_rows(
            rows,
            times,
            lambda s: s * 1e6,
            "native",
            section=op,
            dtype=dtype_name(dtype),
            shape=shape,
            M=m,
            threads=threads,
            unit="us",
        )


def bench_mlp(args, dtype: torch.dtype, threads: int, dram: float, rows: list) -> None:
    """Decode gated MLP (silu) over cold weights, every usable backend: GB/s of the matrices."""
    size = torch.finfo(dtype).bits // 8
    for shape, (h, inter) in progress(
        list(MLP_SHAPES.items()), f"mlp {dtype_name(dtype)} t={threads}", args.quiet
    ):
        gen = torch.Generator().manual_seed(0)
        nbytes = 3 * h * inter * size
        count = max(2, -(-(args.cold_mib << 20) // nbytes))
        dims = ((inter, h), (inter, h), (h, inter))  # gate, up, down
        sets = [
            [(torch.randn(*d, generator=gen) / d[1] ** 0.5).to(dtype) for d in dims]
            for _ in range(count)
        ]
        specs = usable_kernels("gated_mlp", dtype, activation="silu", hidden=h, intermediate=inter)
        packed = {
            b: [s.prepare(g, u, down, "silu") for g, u, down in sets]
            for b, s in specs.items()
            if keep_backend(args.backends, b)
        }
        del sets
        for m in args.gemv_m:
            x = torch.randn(m, h, generator=gen).to(dtype)
            fns = {b: sweep(specs[b].fn, x, ps) for b, ps in packed.items()}
            times = interleaved(fns, args.repeats, args.clock_fn)
            before = len(rows)
            add_rows(
                rows,
                times,
                lambda s, w=nbytes * count: w / s / 1e9,
                "native",
                section="mlp",
                dtype=dtype_name(dtype),
                shape=shape,
                M=m,
                threads=threads,
                unit="GB/s",
            )
            for row in rows[before:]:
                row["of_dram"] = row["value"] / dram


def check_backend_names(names: list[str] | None) -> None:
    """``--backends`` may name registered backends, the references and the model's ``auto``
    plan; an unknown name is a ConfigError (one that is known but not usable here is only
    reported after the run)."""
    known = {*backends(get_host().ops), *REFERENCES, "auto"}
    unknown = sorted(set(names or ()) - known)
    if unknown:
        raise ConfigError(
            f"--backends {' '.join(unknown)}: no such backend; known: {', '.join(sorted(known))}"
        )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every section for every thread count and dtype; returns the JSON payload."""
    if args.clock == "thread" and args.threads != [1]:
        raise ConfigError("--clock thread measures one thread: use it with --threads 1")
    if args.repeats < 5:
        note(args, f"kernels: --repeats {args.repeats}: medians need >= 5 rounds to mean much")
    check_backend_names(args.backends)
    args.clock_fn = time.thread_time if args.clock == "thread" else time.perf_counter
    rows: list[dict[str, Any]] = []
    with torch.inference_mode():
        for threads in args.threads:
            torch.set_num_threads(threads)
            dram = dram_read(args, threads, rows)
            for name in args.dtypes:
                dtype = getattr(torch, name)
                bench_linear(args, dtype, threads, dram, rows)
                if "ops" in args.sections:
                    bench_ops(args, dtype, threads, rows)
                if "mlp" in args.sections:
                    bench_mlp(args, dtype, threads, dram, rows)
                if "model" in args.sections:
                    bench_model(args, dtype, threads, rows)
                if "moe" in args.sections:
                    bench_moe(args, dtype, threads, rows)
                if "qgemv" in args.sections:
                    bench_qgemv(args, dtype, threads, dram, rows)
                if "qgemm" in args.sections:
                    bench_qgemm(args, dtype, threads, rows)
    measured = {r["backend"].split(" ")[0] for r in rows}  # qgemm: "<backend> <format>"
    absent = [b for b in args.backends or () if b not in measured]
    if absent:
        warn(
            f"kernels: --backends {' '.join(absent)}: not usable here (measured: "
            f"{', '.join(sorted(measured))})"
        )
    return emit("kernels", rows, COLUMNS, args)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench kernels [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("kernels", argv)
