"""Loading at the memory floor: load time, peak RSS and RSS after load per weight format.

Each load runs in a fresh process (so peaks do not mix) and reports what the built model keeps
in tensors (``weight_bytes``: packed copies included, shared storages once), its process RSS
after load, the peak RSS during it and the load time. Targets (issue "quantized weights"):
peak <= 1.3 x weights + 0.6 GB, after load <= 1.1 x weights + 0.6 GB. The tokenizer loads
after the weights (as in ``LLMModel``), so ``weights_peak_mb`` is the peak of the weight load
alone and ``tokenizer_mb`` what the tokenizer keeps (Gemma 3's 262k-token vocabulary: ~0.3 GB
kept, ~0.5 GB while transformers parses it).

    pace bench loading --models smollm2 gemma3-270m --variants bf16 int8 int4 gguf
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from pace_bench.common import emit, model_path, note, progress

COLUMNS = ["model", "variant", "weights_mb", "rss_after_mb", "peak_rss_mb", "load_s",
           "after_ok", "peak_ok", "weights_peak_mb", "weights_peak_ok", "tokenizer_mb"]  # fmt: skip
QUICK = {"variants": ["bf16", "int4"]}
GB = 1e9

CHILD = """
import json, resource, sys, time, torch
from pace_core import LLMModel
from pace_core.models.loader import load_tokenizer
from pace_core.quant.memory import weight_bytes

def memory():
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return (int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024)

source, quantization, dtype = sys.argv[1], sys.argv[2] or None, getattr(torch, sys.argv[3])
start = time.perf_counter()
llm = LLMModel(source, dtype=dtype, quantization=quantization, quiet=True, load_tokenizer=False)
weights_rss, weights_peak = memory()
llm.tokenizer = load_tokenizer(llm.path)  # as LLMModel does, after the weights
seconds = time.perf_counter() - start
rss, peak = memory()
print(json.dumps({"weights": weight_bytes(llm.model), "rss": rss, "peak": peak,
                  "weights_peak": weights_peak, "tokenizer": rss - weights_rss,
                  "seconds": seconds}))
"""


def measure(source: str, quantization: str | None, dtype: str) -> dict[str, float]:
    """Load once in a child process; its numbers (bytes, seconds)."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, source, quantization or "", dtype],
        capture_output=True, text=True, check=False, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"loading {source} failed: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def row(model: str, variant: str, m: dict[str, float]) -> dict[str, Any]:
    weights = m["weights"]
    return {
        "model": model, "variant": variant, "weights_mb": round(weights / 1e6, 1),
        "rss_after_mb": round(m["rss"] / 1e6, 1), "peak_rss_mb": round(m["peak"] / 1e6, 1),
        "load_s": round(m["seconds"], 1),
        "after_ok": m["rss"] <= 1.1 * weights + 0.6 * GB,
        "peak_ok": m["peak"] <= 1.3 * weights + 0.6 * GB,
        "weights_peak_mb": round(m["weights_peak"] / 1e6, 1),
        "weights_peak_ok": m["weights_peak"] <= 1.3 * weights + 0.6 * GB,
        "tokenizer_mb": round(m["tokenizer"] / 1e6, 1),
    }  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["smollm2"])
    p.add_argument("--variants", nargs="+", default=["bf16", "int8", "int4", "gguf"],
                   help="bf16, fp32, a quantization preset, or gguf (its own file)")  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pace_bench.quality import gguf_file

    rows = []
    note(args, f"loading: load_average={os.getloadavg()}")
    for name in progress(args.models, "loading", args.quiet):
        path = str(model_path(name))
        for variant in args.variants:
            if variant == "gguf":
                m = measure(str(gguf_file(name)), None, "bfloat16")
            elif variant in ("bf16", "fp32"):
                m = measure(path, None, {"bf16": "bfloat16", "fp32": "float32"}[variant])
            else:
                m = measure(path, variant, "bfloat16")
            rows.append(row(name, variant, m))
    return emit("loading", rows, COLUMNS, args)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench loading [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("loading", argv)
