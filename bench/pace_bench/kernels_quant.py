"""The ``qgemv`` and ``qgemm`` sections of ``pace bench kernels``: quantized weights.

``qgemm``: for every ``--shapes`` K x N and ``--gemm-m`` M, each backend's ``linear`` on the
dense weight (the model dtype) and on each ``--qgemm-formats`` quantization of it, round-robin:
``w8a8`` (the default: int8 weights, int8 activations), or any of the ``qgemv`` formats (pace
presets, GGUF blocks; pace-avx512 takes bf16 activations of those as
``PACE_QUANT_ACTIVATIONS`` says when the weights are packed, so set it to ``int8`` for its
int8-activation tiles); GFLOP/s (2 M N K per call, integer ops where quantized) and
``vs_dense``, each quantized rate over the same backend's dense rate: the bar pace-avx512's
W8A8 GEMM is held to (1.8x bf16 at M >= 32). With ``--qgemm-paths`` pace-avx512's own paths for
bf16 rows are timed side by side too, each forced at every M: ``panel`` (weights de-quantized to
bf16 panels, ``csrc/qpanel.cpp``), ``words`` (the avx2 build's int16 word tiles,
``csrc/qwords_tile.h``) and ``planes`` (the two-plane VNNI tiles): the measurements its
``qpanel_rows`` threshold and the avx2 build's choice of kinds for the panel come from.

``qgemv``:

for every ``--shapes`` K x N and quantized format (pace's ``int8`` and ``int4`` presets, GGUF
``q8_0``, ``q4_0``, ``q4_k`` and ``q6_k`` written by pace's block writers; a K that is not a
whole number of the format's blocks is skipped with a note), every backend whose ``linear``
takes that format here multiplies ``--gemv-m`` activation rows by a set of ``--cold-mib`` of such
matrices in turn (cold: each call reads its weights from DRAM), round-robin with a streaming
read of as many bytes (``avx512.stream_read`` over the huge pages the packed weights live in,
where pace-avx512 is usable: the reference is timed in the same rounds, so a noisy host moves
both alike). ``value`` is GB/s of the format's own bytes (``QuantizedWeight.nbytes``: codes,
scales and mins, as the file holds them) and ``of_dram`` its share of that reference (else of
the ``dram-read`` rows): the bar pace-avx512's quantized GEMV is held to.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

import torch

from pace_bench.common import (
    add_rows,
    dtype_name,
    interleaved,
    keep_backend,
    note,
    parse_shape,
    progress,
    read_buffer,
    stream_read_fn,
    sweep,
    usable_kernels,
)
from pace_core.quant import PRESETS, QuantizedWeight, quantize
from pace_core.quant.gguf_blocks import block_type, quantize_k, quantize_q4_0, quantize_q8_0

FORMATS = ("int8", "int4", "q8_0", "q4_0", "q4_k", "q6_k")
QGEMM_FORMATS = ("w8a8", *FORMATS)
REFERENCE = "avx512.stream_read"


def quantized(fmt: str, w: torch.Tensor) -> QuantizedWeight:
    """``w`` [N, K] in format ``fmt`` (one of :data:`FORMATS`: pace presets, GGUF blocks)."""
    if fmt in PRESETS:
        return quantize(w, PRESETS[fmt])
    writers = {"q8_0": quantize_q8_0, "q4_0": quantize_q4_0}
    raw = writers[fmt](w.float()) if fmt in writers else quantize_k(w.float(), fmt)
    return QuantizedWeight(fmt, tuple(w.shape), w.dtype, raw)


def bench_qgemv(args: Any, dtype: torch.dtype, threads: int, dram: float, rows: list) -> None:
    """GB/s (format bytes) per backend, format, shape and M, with its share of the streaming
    read timed alongside (``dram``, the ``dram-read`` rows' best, without pace-avx512)."""
    cases = [(shape, fmt) for shape in args.shapes for fmt in FORMATS]
    for shape, fmt in progress(cases, f"qgemv {dtype_name(dtype)} t={threads}", args.quiet):
        k, n = parse_shape(shape)
        if fmt not in PRESETS and k % block_type(fmt).block_elems:
            note(args, f"qgemv: {shape} {fmt} skipped: K is not a whole number of {fmt} blocks")
            continue
        specs = usable_kernels("linear", dtype, in_features=k, out_features=n, weight_format=fmt)
        specs = {b: s for b, s in specs.items() if keep_backend(args.backends, b)}
        if not specs:
            continue
        gen = torch.Generator().manual_seed(0)
        first = quantized(fmt, (torch.randn(n, k, generator=gen) / k**0.5).to(dtype))
        count = max(3, -(-(args.cold_mib << 20) // first.nbytes))
        weights = [first] + [copy.deepcopy(first) for _ in range(count - 1)]  # own memory each
        packed = {b: [s.prepare(w, None) for w in weights] for b, s in specs.items()}
        work = first.nbytes * count
        stream = stream_read_fn()
        reference = None if stream is None else partial(stream, read_buffer(work))
        for m in args.gemv_m:
            x = torch.randn(m, k, generator=gen).to(dtype)
            fns = {b: sweep(specs[b].fn, x, packed[b]) for b in specs}
            if reference is not None:
                fns[REFERENCE] = reference
            times = interleaved(fns, args.repeats, args.clock_fn)
            before = len(rows)
            add_rows(rows, times, lambda s, w=work: w / s / 1e9, "native", section="qgemv",
                     dtype=dtype_name(dtype), shape=f"{shape} {fmt}", M=m, threads=threads,
                     unit="GB/s")  # fmt: skip
            added = rows[before:]
            read = next((r["value"] for r in added if r["backend"] == REFERENCE), dram)
            for row in added:
                row["of_dram"] = row["value"] / read
        del packed, weights, reference


def forced_paths(fns: dict, pairs: list, dtype: torch.dtype) -> dict:
    """pace-avx512's quantized paths for bf16 rows, each forced (``--qgemm-paths``): for every
    quantized ``avx512 <format>`` timing, ``... panel``, ``... words`` (builds with word tiles)
    and ``... planes``. Each call sets the kernels' tuning knobs, then restores them."""
    if dtype != torch.bfloat16:
        return {}
    from pace_avx512 import build

    ext = build.load_extension()
    paths = {"panel": (1, True), "planes": (0, False)}
    if ext.has_word_tiles:
        paths["words"] = (0, True)
    knobs = ("qpanel_rows", "qword_tiles", "qpanel_every_kind")

    def forced(run, panel_rows: int, words: bool):
        def call() -> None:
            before = [getattr(ext, knob)() for knob in knobs]
            for knob, value in zip(knobs, (panel_rows, words, panel_rows > 0)):
                getattr(ext, f"set_{knob}")(value)
            try:
                run()
            finally:
                for knob, value in zip(knobs, before):
                    getattr(ext, f"set_{knob}")(value)

        return call

    return {f"{quant} {path}": forced(fns[quant], *knobs)
            for quant, _ in pairs if quant.startswith("avx512 ") and not quant.endswith("w8a8")
            for path, knobs in paths.items()}  # fmt: skip


def bench_qgemm(args: Any, dtype: torch.dtype, threads: int, rows: list) -> None:
    """GFLOP/s per backend of the dense weight and its ``--qgemm-formats`` quantizations, for
    each shape and M."""
    for shape in progress(args.shapes, f"qgemm {dtype_name(dtype)} t={threads}", args.quiet):
        k, n = parse_shape(shape)
        dense = usable_kernels("linear", dtype, in_features=k, out_features=n)
        gen = torch.Generator().manual_seed(0)
        weights = [(torch.randn(n, k, generator=gen) / k**0.5).to(dtype) for _ in range(2)]
        packed, pairs = {}, []  # name -> (fn, packed weights); (quantized name, dense name)
        for fmt in args.qgemm_formats:
            if fmt not in PRESETS and fmt != "w8a8" and k % block_type(fmt).block_elems:
                note(args, f"qgemm: {shape} {fmt} skipped: K is not a whole number of blocks")
                continue
            specs = usable_kernels("linear", dtype, in_features=k, out_features=n,
                                   weight_format="int8" if fmt == "w8a8" else fmt)  # fmt: skip
            backends = [b for b in dense if b in specs and keep_backend(args.backends, b)]
            if fmt == "w8a8":
                quants = [quantize(w, PRESETS["w8a8"]) for w in weights]
            else:
                quants = [quantized(fmt, w) for w in weights]
            for b in backends:
                if f"{b} dense" not in packed:
                    ws = [dense[b].prepare(w, None) for w in weights]
                    packed[f"{b} dense"] = (dense[b].fn, ws)
                packed[f"{b} {fmt}"] = (specs[b].fn, [specs[b].prepare(q, None) for q in quants])
                pairs.append((f"{b} {fmt}", f"{b} dense"))
        if not pairs:
            continue
        for m in args.gemm_m:
            x = torch.randn(m, k, generator=gen).to(dtype)
            fns = {name: sweep(fn, x, ws) for name, (fn, ws) in packed.items()}
            if args.qgemm_paths:
                fns.update(forced_paths(fns, pairs, dtype))
            times = interleaved(fns, args.repeats, args.clock_fn)
            before = len(rows)
            work = 2 * m * n * k * len(weights)
            add_rows(rows, times, lambda s, w=work: w / s / 1e9, None, section="qgemm",
                     dtype=dtype_name(dtype), shape=shape, M=m, threads=threads,
                     unit="GFLOP/s")  # fmt: skip
            row = {r["backend"]: r for r in rows[before:]}
            for name, r in row.items():
                if name.startswith("avx512 ") and name not in packed:  # a forced path
                    r["vs_dense"] = r["value"] / row["avx512 dense"]["value"]
            for quant, base in pairs:
                row[quant]["vs_dense"] = row[quant]["value"] / row[base]["value"]
        del packed
