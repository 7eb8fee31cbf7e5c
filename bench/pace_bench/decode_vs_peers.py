"""Batch-1 decode and prefill: pace (auto), pace (native), transformers and llama.cpp side by side.

The bar of the AVX-512 plugin: for each model, thread count and prompt length, every engine
prefills the same random prompt and decodes greedily, timed round-robin (medians). llama.cpp
(llama-cpp-python, ``make bench-peers``) runs a BF16 GGUF converted from the same checkpoint;
it is skipped with a note when absent. Ratios: ``decode_vs_llama``, ``decode_vs_hf``,
``prefill_vs_hf``; a summary states each target (decode >= 1.0x llama.cpp, >= 2.5x
transformers; prefill >= 1.5x transformers) as met or not.

    pace bench decode_vs_peers --models smollm2 gemma3-270m --threads 1 2 --prompt-lens 128 512
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

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
from pace_bench.offline import LlamaCppRunner, measure_point, pace_runner, transformers_runner
from pace_core.arg_types import at_least

ENGINES = ("pace", "pace-native", "transformers", "llama.cpp")
PLANS = {"pace": None, "pace-native": {"default": "native"}}  # OperatorConfig per pace engine
TARGETS = (  # (ratio column, engine, minimum): the bar of issue #10
    ("decode_vs_llama", "pace", 1.0),
    ("decode_vs_hf", "pace", 2.5),
    ("prefill_vs_hf", "pace", 1.5),
)
COLUMNS = [
    "model",
    "engine",
    "threads",
    "prompt_len",
    "prefill_tok_s",
    "decode_tok_s",
    "decode_vs_llama",
    "decode_vs_hf",
    "prefill_vs_hf",
]
QUICK = {"models": ["smollm2"], "threads": [1], "prompt_lens": [128], "new_tokens": 16,
         "repeats": 2}  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["smollm2", "gemma3-270m"])
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--threads", nargs="+", type=at_least(1), default=[1, 2])
    p.add_argument("--prompt-lens", nargs="+", type=at_least(1), default=[128, 512])
    p.add_argument("--new-tokens", type=at_least(1), default=64)
    p.add_argument("--repeats", type=at_least(1), default=5)


def load_engines(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """engine -> ``make(ids, new_tokens) -> fn`` in bf16; unavailable peers are noted."""
    from pace_bench import peers
    from pace_core import LLMModel

    path, engines = model_path(name), {}
    for engine, plan in PLANS.items():
        if engine in args.engines:
            model = LLMModel(
                path,
                dtype=torch.bfloat16,
                opconfig=plan,
                quiet=True,
                load_tokenizer=False,
                prefix_caching=False,
            )  # repeated prompts
            engines[engine] = lambda ids, n, m=model: pace_runner(m, ids, n)
    if "transformers" in args.engines:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).eval()
        engines["transformers"] = lambda ids, n: transformers_runner(hf, ids, n)
    if "llama.cpp" in args.engines:
        try:
            if peers.find_llama_cpp() is None:
                raise peers.PeerUnavailable("llama-cpp-python is not installed (make bench-peers)")
            gguf = peers.gguf_for(path, "bf16")
            engines["llama.cpp"] = LlamaCppRunner(gguf, max(args.prompt_lens) + args.new_tokens + 8)
        except peers.PeerUnavailable as exc:
            note(args, f"decode_vs_peers: llama.cpp skipped: {exc}")
    return engines


def with_ratios(measured: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Add decode/prefill ratios to llama.cpp and transformers where both were measured."""
    for base, suffix in (("llama.cpp", "llama"), ("transformers", "hf")):
        ref = measured.get(base)
        if ref is None:
            continue
        for r in measured.values():
            r[f"decode_vs_{suffix}"] = r["decode_tok_s"] / ref["decode_tok_s"]
            r[f"prefill_vs_{suffix}"] = r["prefill_tok_s"] / ref["prefill_tok_s"]
    return measured


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per target: the worst ratio over models/threads/prompts and whether it is met."""
    out = []
    for column, engine, minimum in TARGETS:
        values = [r[column] for r in rows if r["engine"] == engine and column in r]
        if values:
            out.append(target_row(f"{engine} {column}", values, minimum))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    args.new_tokens = max(args.new_tokens, 2)
    rows = []
    points = [(t, p) for t in args.threads for p in args.prompt_lens]
    for name in args.models:
        engines = load_engines(name, args)
        vocab = vocab_size(model_path(name))
        gen = torch.Generator().manual_seed(0)
        for threads, prompt_len in progress(points, f"decode_vs_peers {name}", args.quiet):
            torch.set_num_threads(threads)
            ids = random_prompts(vocab, 1, prompt_len, gen)
            for engine, r in with_ratios(measure_point(engines, ids, args)).items():
                rows.append({"model": name, "engine": engine, "threads": threads,
                             "prompt_len": prompt_len, **r})  # fmt: skip
    return with_targets(emit("decode_vs_peers", rows, COLUMNS, args), summary(rows), args.quiet)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench decode_vs_peers [argv]``."""
    from pace_bench.cli import main_for

    return main_for("decode_vs_peers", argv)
