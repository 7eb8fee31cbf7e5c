"""Quantized weights: pace and llama.cpp on the same GGUF files, plus pace's quantize-on-load.

For each model, every format runs as the engines that can run it, all timed round-robin per
(threads, prompt length, batch) point (medians), greedy; a batch of several sequences decodes
together (llama.cpp: its batched decoding, every sequence in one context):

- ``bf16``: pace on the checkpoint; llama.cpp on its BF16 GGUF (converted from the checkpoint);
- ``q8_0``, ``q4_0``, ``q4_k_m``: the BF16 GGUF quantized by llama.cpp's own quantizer, run by
  both engines (pace reads the file as it is);
- ``original``: the GGUF the model ships as (SmolLM2 Q4_1 + Q8_0, Gemma-3 Q4_K_M), both engines;
- ``int8``, ``int4``, ``w8a8``: pace's quantize-on-load of the checkpoint.

Two llama.cpp engines: ``llama.cpp`` (llama-cpp-python, ``make bench-peers``; batches too) and
``llama-bench``, the newest llama.cpp's own benchmark program (``make bench-llama-cpp``; batches
of one, timed by its clock, one run per turn). ``random:llama-3.2-1b`` and the other full-depth
random shapes run their GGUFs of :func:`pace_bench.random_models.random_gguf` (no BF16 GGUF).

``--activations exact int8`` also runs each quantized format as engine ``pace-a8``: the same
file loaded under ``PACE_QUANT_ACTIVATIONS=int8`` (pace-avx512's int8 activations, llama.cpp's
precision; ``pace`` is the default, ``exact``).

Ratios: ``decode_vs_llama`` / ``prefill_vs_llama`` (pace over llama-cpp-python on the same
file), ``decode_vs_newest`` / ``prefill_vs_newest`` (over llama-bench) and ``decode_vs_bf16`` /
``prefill_vs_bf16`` (over pace bf16 in the same run). The summary states each target as met or
not.

    pace bench quantized --models smollm2 gemma3-270m --threads 1 2 --prompt-lens 128 512 \
        --batches 1 8
    pace bench quantized --models random:llama-3.2-1b --formats bf16 q8_0 q4_k_m \
        --engines pace llama-bench --threads 2 --batches 1
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from pace_bench import activations
from pace_bench.common import (
    emit,
    model_path,
    note,
    progress,
    random_prompts,
    target_row,
    vocab_size,
    with_targets,
)
from pace_bench.llama_cpp_tools import LlamaBenchRunner
from pace_bench.offline import LlamaCppRunner, measure_point, pace_runner
from pace_core.arg_types import at_least

FORMATS = ("bf16", "q8_0", "q4_0", "q4_k_m", "original", "int8", "int4", "w8a8")
LLAMA_MADE = ("q8_0", "q4_0", "q4_k_m")  # quantized by llama.cpp from the BF16 GGUF
PACE_ONLY = ("int8", "int4", "w8a8")  # quantize-on-load presets
ENGINES = ("pace", "llama.cpp", "llama-bench")
TARGETS = (  # (ratio column, formats, minimum)
    ("decode_vs_llama", ("q8_0", "q4_0", "q4_k_m"), 1.2),
    ("decode_vs_newest", ("q8_0", "q4_k_m"), 1.4),
    ("decode_vs_bf16", ("int4",), 1.8),
    ("prefill_vs_bf16", ("q8_0", "q4_k_m"), 1.7),
    ("prefill_vs_bf16", ("q4_0", "original", "int8", "int4", "w8a8"), 1.0),
    ("prefill_vs_llama", ("q8_0", "q4_0", "q4_k_m", "original"), 1.5),
    ("prefill_vs_newest", ("q8_0", "q4_k_m"), 2.5),
)
COLUMNS = [
    "model", "format", "engine", "threads", "prompt_len", "batch", "prefill_tok_s", "decode_tok_s",
    "decode_vs_llama", "prefill_vs_llama", "decode_vs_newest", "prefill_vs_newest",
    "decode_vs_bf16", "prefill_vs_bf16", "weights_mb",
]  # fmt: skip
QUICK = {"models": ["smollm2"], "threads": [1], "prompt_lens": [128], "batches": [1],
         "new_tokens": 16, "repeats": 2, "formats": ["bf16", "q8_0", "int4"]}  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["smollm2", "gemma3-270m"])
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    p.add_argument("--engines", nargs="+", default=["pace", "llama.cpp"], choices=ENGINES)
    p.add_argument("--threads", nargs="+", type=at_least(1), default=[1, 2])
    p.add_argument("--prompt-lens", nargs="+", type=at_least(1), default=[128, 512])
    p.add_argument(
        "--batches",
        nargs="+",
        type=at_least(1),
        default=[1, 8],
        help="sequences decoded together (random prompts of the same length)",
    )
    p.add_argument("--new-tokens", type=at_least(1), default=64)
    p.add_argument("--repeats", type=at_least(1), default=5)
    activations.add_argument(p)


def _files(name: str, fmt: str) -> tuple[Path, Path | None]:
    """(what pace loads, the GGUF llama.cpp runs or None) for one format."""
    from pace_bench import peers
    from pace_bench.quality import gguf_file
    from pace_bench.random_models import is_random_name, random_gguf

    path = model_path(name)
    if is_random_name(name) and fmt in ("bf16", *PACE_ONLY):
        return path, None
    if is_random_name(name):
        gguf = random_gguf(name, fmt)
        return gguf, gguf
    if fmt == "original":
        gguf = gguf_file(name)
        return gguf, gguf
    if fmt in PACE_ONLY:
        return path, None
    if fmt == "bf16":
        return path, peers.gguf_for(path, "bf16") if peers.find_llama_cpp() else None
    gguf = peers.quantized_gguf(path, fmt)
    return gguf, gguf


def load_engines(name: str, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, float]]:
    """(``"<engine> <format>"`` -> make(ids, n) -> fn, weights MB per pace engine)."""
    from pace_bench import peers
    from pace_core import LLMModel
    from pace_core.quant.memory import weight_bytes

    engines: dict[str, Any] = {}
    sizes: dict[str, float] = {}
    n_ctx = max(args.prompt_lens) + args.new_tokens + 8
    modes = activations.modes(args)
    for fmt in args.formats:
        try:
            source, gguf = _files(name, fmt)
        except peers.PeerUnavailable as exc:
            note(args, f"quantized: {name} {fmt} skipped: {exc}")
            continue
        if "pace" in args.engines:
            quant = fmt if fmt in PACE_ONLY else None
            for mode in activations.for_model(modes, quantized=fmt != "bf16",
                                              dtype=torch.bfloat16):  # fmt: skip
                with activations.loaded_under(mode):
                    # prefix caching off: every repeat runs the same prompt
                    model = LLMModel(source, dtype=torch.bfloat16, quantization=quant,
                                     quiet=True, load_tokenizer=False,
                                     prefix_caching=False)  # fmt: skip
                label = f"{activations.ENGINES[mode]} {fmt}"
                engines[label] = lambda ids, n, m=model: pace_runner(m, ids, n)
                sizes[label] = weight_bytes(model.model) / 1e6
        if "llama.cpp" in args.engines and gguf is not None and peers.find_llama_cpp():
            engines[f"llama.cpp {fmt}"] = LlamaCppRunner(gguf, n_ctx)
        if "llama-bench" in args.engines and gguf is not None:
            try:
                engines[f"llama-bench {fmt}"] = LlamaBenchRunner(gguf)
            except peers.PeerUnavailable as exc:
                note(args, f"quantized: llama-bench skipped: {exc}")
    if "llama.cpp" in args.engines and not peers.find_llama_cpp():
        note(args, "quantized: llama.cpp skipped: llama-cpp-python is not installed "
             "(make bench-peers)")  # fmt: skip
    return engines, sizes


def with_ratios(measured: dict[str, dict[str, float]]) -> None:
    """Add the pace/llama.cpp (same file) and pace/pace-bf16 ratios in place."""
    bf16 = measured.get("pace bf16")
    for label, r in measured.items():
        engine, fmt = label.split(" ", 1)
        if engine not in activations.ENGINES.values():
            continue
        llama, newest = measured.get(f"llama.cpp {fmt}"), measured.get(f"llama-bench {fmt}")
        for ref, suffix in ((llama, "llama"), (newest, "newest"), (bf16, "bf16")):
            if ref is not None:
                r[f"decode_vs_{suffix}"] = r["decode_tok_s"] / ref["decode_tok_s"]
                r[f"prefill_vs_{suffix}"] = r["prefill_tok_s"] / ref["prefill_tok_s"]


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per target and format: the worst ratio over models/threads/prompts."""
    out = []
    for column, formats, minimum in TARGETS:
        for engine in activations.ENGINES.values():
            for fmt in formats:
                values = [r[column] for r in rows if r["engine"] == engine
                          and r["format"] == fmt and column in r]  # fmt: skip
                if values:
                    out.append(target_row(f"{engine} {fmt} {column}", values, minimum))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    args.new_tokens = max(args.new_tokens, 2)
    rows = []
    points = [(t, p, b) for t in args.threads for p in args.prompt_lens for b in args.batches]
    for name in args.models:
        engines, sizes = load_engines(name, args)
        vocab = vocab_size(model_path(name))
        gen = torch.Generator().manual_seed(0)
        for threads, prompt_len, batch in progress(points, f"quantized {name}", args.quiet):
            torch.set_num_threads(threads)
            ids = random_prompts(vocab, batch, prompt_len, gen)
            here = {k: v for k, v in engines.items() if getattr(v, "max_batch", batch) >= batch}
            measured = measure_point(here, ids, args)
            with_ratios(measured)
            for label, r in measured.items():
                engine, fmt = label.split(" ", 1)
                rows.append({"model": name, "format": fmt, "engine": engine, "threads": threads,
                             "prompt_len": prompt_len, "batch": batch,
                             "weights_mb": sizes.get(label), **r})  # fmt: skip
    return with_targets(emit("quantized", rows, COLUMNS, args), summary(rows), args.quiet)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench quantized [argv]``."""
    from pace_bench.cli import main_for

    return main_for("quantized", argv)
