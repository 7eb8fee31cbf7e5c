"""Loading at the memory floor: load time, peak RSS and RSS after load per weight format.

Each load runs in a fresh process (so peaks do not mix) and reports what the built model keeps
in tensors (``weight_bytes``: packed copies included, shared storages once), its process RSS
after load, the peak RSS during it and the load time. The bars (issue #43) are against the
"file": a GGUF file's size, else the bytes the model keeps (the quantized weights of a
quantize-on-load): peak <= 1.2 x file + 0.5 GB, after load <= 1.1 x file + 0.4 GB. The
tokenizer loads after the weights (as in ``LLMModel``), so ``weights_peak_mb`` is the peak of
the weight load alone and ``tokenizer_mb`` what the tokenizer keeps (Gemma 3's 262k-token
vocabulary: ~0.3 GB kept, ~0.5 GB while transformers parses it).

``--models`` takes zoo names, directories, ``random:<shape>`` (full-depth random checkpoints:
``random:llama-3.2-1b``, ``-3b``, ``random:llama-3.1-8b``) and GGUF files (one row, variant
``gguf``). ``--variants``: ``bf16``, ``fp32``, a quantization preset (``int8``, ``w8a8``, ...),
``gguf`` (a zoo model's own GGUF file) or a llama.cpp file type (``q8_0``, ``q4_k_m``, ...: the
model's GGUF made by llama.cpp's converter and quantizer, ``make bench-peers``).

    pace bench loading --models smollm2 gemma3-270m --variants bf16 int8 int4 gguf
    pace bench loading --models random:llama-3.2-1b random:llama-3.2-3b \\
        --variants q4_k_m q8_0 int8 w8a8
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from pace_bench.common import (
    emit,
    model_path,
    note,
    progress,
    run_child,
)

COLUMNS = ["model", "variant", "file_mb", "weights_mb", "rss_after_mb", "peak_rss_mb",
           "load_s", "after_ok", "peak_ok", "weights_peak_mb", "weights_peak_ok",
           "tokenizer_mb"]  # fmt: skip
QUICK = {"variants": ["bf16", "int4"]}
GB = 1e9
PEAK_BAR = (1.2, 0.5 * GB)  # peak RSS <= 1.2 x file + 0.5 GB
AFTER_BAR = (1.1, 0.4 * GB)  # RSS after load <= 1.1 x file + 0.4 GB
BARS = "peak <= 1.2 x file + 0.5 GB, after load <= 1.1 x file + 0.4 GB"


def peak_ok(rss: float, file: float) -> bool:
    return rss <= PEAK_BAR[0] * file + PEAK_BAR[1]


def after_ok(rss: float, file: float) -> bool:
    return rss <= AFTER_BAR[0] * file + AFTER_BAR[1]


CHILD = """
import json, resource, sys, time, torch
from pace_core import LLMModel
from pace_core.models.loader import load_tokenizer
from pace_core.quant.memory import weight_bytes
from pace_bench.common import process_memory as memory

source, quantization, dtype = sys.argv[1], sys.argv[2] or None, getattr(torch, sys.argv[3])
start = time.perf_counter()
llm = LLMModel(source, dtype=dtype, quantization=quantization, quiet=True, load_tokenizer=False)
weights_rss, weights_peak = memory()
try:
    llm.tokenizer = load_tokenizer(llm.path)  # as LLMModel does, after the weights
except Exception:  # none to load (a random-weight checkpoint, a placeholder vocabulary)
    llm.tokenizer = None
seconds = time.perf_counter() - start
rss, peak = memory() if llm.tokenizer is not None else (weights_rss, weights_peak)
print(json.dumps({"weights": weight_bytes(llm.model), "rss": rss, "peak": peak,
                  "weights_peak": weights_peak, "tokenizer": rss - weights_rss,
                  "seconds": seconds}))
"""


def measure(source: str, quantization: str | None, dtype: str) -> dict[str, float]:
    """Load once in a child process; its numbers (bytes, seconds)."""
    return run_child(CHILD, [source, quantization or "", dtype], f"loading {source}")


def row(model: str, variant: str, m: dict[str, float], file: float | None = None) -> dict[str, Any]:
    """One result row; ``file``: the GGUF file's bytes (default: the weights the model keeps)."""
    weights = m["weights"]
    file = weights if file is None else file
    return {
        "model": model, "variant": variant, "file_mb": round(file / 1e6, 1),
        "weights_mb": round(weights / 1e6, 1),
        "rss_after_mb": round(m["rss"] / 1e6, 1), "peak_rss_mb": round(m["peak"] / 1e6, 1),
        "load_s": round(m["seconds"], 1),
        "after_ok": after_ok(m["rss"], file),
        "peak_ok": peak_ok(m["peak"], file),
        "weights_peak_mb": round(m["weights_peak"] / 1e6, 1),
        "weights_peak_ok": peak_ok(m["weights_peak"], file),
        "tokenizer_mb": round(m["tokenizer"] / 1e6, 1),
    }  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["smollm2"])
    p.add_argument("--variants", nargs="+", default=["bf16", "int8", "int4", "gguf"],
                   help="bf16, fp32, a quantization preset, gguf (a zoo model's own file) or a "
                   "llama.cpp file type (q8_0, q4_k_m, ...: made by llama.cpp)")  # fmt: skip


def gguf_of(name: str, variant: str) -> Path:
    """The GGUF file of ``variant`` for model ``name``: a zoo model's own (``gguf``), or one
    llama.cpp makes (a file type of :data:`pace_bench.peers.LLAMA_FTYPES`)."""
    from pace_bench import peers, random_models
    from pace_bench.quality import gguf_file

    if variant == "gguf":
        return gguf_file(name)
    if random_models.is_random_name(name):
        return random_models.random_gguf(name, variant)
    return peers.quantized_gguf(model_path(name), variant)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pace_bench.peers import LLAMA_FTYPES

    rows = []
    note(args, f"loading: load_average={os.getloadavg()}; bars: {BARS}")
    for name in progress(args.models, "loading", args.quiet):
        if str(name).endswith(".gguf"):
            file = Path(name).expanduser()
            rows.append(
                row(name, "gguf", measure(str(file), None, "bfloat16"), file.stat().st_size)
            )
            continue
        for variant in args.variants:
            if variant == "gguf" or variant in LLAMA_FTYPES:
                file = gguf_of(name, variant)
                m = measure(str(file), None, "bfloat16")
                rows.append(row(name, variant, m, file.stat().st_size))
                continue
            path = str(model_path(name))
            if variant in ("bf16", "fp32"):
                m = measure(path, None, {"bf16": "bfloat16", "fp32": "float32"}[variant])
            else:
                m = measure(path, variant, "bfloat16")
            rows.append(row(name, variant, m))
    return emit("loading", rows, COLUMNS, args)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench loading [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("loading", argv)
