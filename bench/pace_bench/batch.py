"""Offline batches: many prompts through one ``LLMModel.generate`` call, speed and peak memory.

``generate`` streams a call's prompts through the engine core (a bounded running set, chunked
prefill, a KV pool of fixed size), so its memory must not grow with the number of prompts and
batching must pay. Two workloads, each in a fresh process (so peaks do not mix):

- ``mixed``: ``--mixed-prompts`` prompts of 16..512 random words, ``--new-tokens`` each, EOS
  allowed. Reported: output tokens/s of the whole call and that rate over the same process's
  batch-1 decode rate (one greedy stream of ``--new-tokens`` tokens, its first token excluded).
- ``many``: for each of ``--many-prompts`` (e.g. ``50 200 1000``), that many prompts of
  ``--many-tokens`` tokens (random words, no shared prefix) with 16 new tokens each.
  Target: the process's peak RSS <= ``--max-rss-gb`` whatever the count.

Every run also generates its first ``--check`` prompts one at a time and counts the prompts
whose greedy tokens equal the batched ones. In float32 they must all be equal (a target); in
bfloat16 the kernels are not batch-invariant, so a near-tie may flip and the count is reported.

    pace bench batch --models smollm2 --many-prompts 50 200 1000
    pace bench batch --models smollm2 --workloads mixed --dtype float32 --check 16
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from typing import Any

from pace_bench.common import (
    TEXT_WORDS,
    ceiling_row,
    emit,
    make_texts,
    model_path,
    process_memory,
    progress,
    run_child,
    target_row,
    usable_cores,
    with_targets,
)
from pace_core.arg_types import above, at_least
from pace_core.errors import PaceError

COLUMNS = ["model", "dtype", "workload", "prompts", "prompt_tokens", "output_tokens", "seconds",
           "output_tok_s", "batch1_tok_s", "vs_batch1", "load_peak_rss_mb", "peak_rss_mb",
           "rss_after_mb", "checked", "identical"]  # fmt: skip
QUICK = {"mixed_prompts": 8, "many_prompts": [16], "many_tokens": 64, "check": 2}
WORKLOADS = ("mixed", "many")
MANY_NEW_TOKENS = 16
MIXED_WORDS = (16, 512)
SEED = 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["smollm2"], help="zoo names or directories")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    p.add_argument("--mixed-prompts", type=at_least(1), default=96)
    p.add_argument("--new-tokens", type=at_least(2), default=64, help="mixed workload")
    p.add_argument("--many-prompts", nargs="+", type=at_least(1), default=[1000])
    p.add_argument("--many-tokens", type=at_least(1), default=620, help="many workload")
    p.add_argument("--check", type=at_least(0), default=10,
                   help="prompts also generated one at a time and compared")  # fmt: skip
    p.add_argument("--max-rss-gb", type=above(0), default=3.0, help="many workload's target")
    p.add_argument("--threads", type=at_least(1), default=None, help="default: usable cores")


def mixed_texts(count: int, seed: int = SEED) -> list[str]:
    """``count`` prompts of 16..512 random words (no two share a prefix)."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(TEXT_WORDS, k=rng.randint(*MIXED_WORDS))) for _ in range(count)]


def _batch1_tok_s(llm: Any, text: str, new_tokens: int) -> float:
    """One greedy stream's decode rate (tokens after the first over the time they took)."""
    from pace_core import SamplingConfig

    cfg = SamplingConfig(max_new_tokens=new_tokens, ignore_eos=True)
    stamps = [time.perf_counter() for _ in llm.stream(text, cfg)]
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def run_workload(spec: dict[str, Any]) -> dict[str, Any]:
    """One workload in this process (the child's job): the numbers of one result row."""
    import torch

    from pace_core import LLMModel, SamplingConfig

    torch.set_num_threads(spec["threads"])
    llm = LLMModel(spec["model"], dtype=spec["dtype"], quiet=True)
    _, load_peak = process_memory()
    if spec["workload"] == "mixed":
        texts, new_tokens, ignore_eos = mixed_texts(spec["prompts"]), spec["new_tokens"], False
    else:
        texts = make_texts(llm.tokenizer, spec["prompts"], spec["tokens"], seed=SEED)
        new_tokens, ignore_eos = MANY_NEW_TOKENS, True
    cfg = SamplingConfig(max_new_tokens=new_tokens, ignore_eos=ignore_eos)
    llm.generate(texts[:2], cfg)  # warm: kernels, pools, allocator
    mixed = spec["workload"] == "mixed"
    batch1 = _batch1_tok_s(llm, texts[0], new_tokens) if mixed else None
    start = time.perf_counter()
    out = llm.generate(texts, cfg)
    seconds = time.perf_counter() - start
    rss, peak = process_memory()
    generated = out.generated_token_ids
    alone = [llm.generate(t, cfg).generated_token_ids[0] for t in texts[: spec["check"]]]
    output_tokens = sum(len(g) for g in generated)
    return {
        "prompt_tokens": sum(len(llm.tokenizer(t)["input_ids"]) for t in texts),
        "output_tokens": output_tokens, "seconds": seconds,
        "output_tok_s": output_tokens / seconds, "batch1_tok_s": batch1,
        "load_peak": load_peak, "peak": peak, "rss": rss,
        "checked": len(alone), "identical": sum(a == b for a, b in zip(alone, generated)),
    }  # fmt: skip


def child_main() -> None:
    """Entry of the measuring process: a JSON spec in ``argv[1]``, a JSON row on stdout (or
    ``{"error": ...}`` for a pace error: a model that does not load, a bad option)."""
    try:
        result = run_workload(json.loads(sys.argv[1]))
    except PaceError as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result), flush=True)


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one workload in a fresh process and return its numbers."""
    code = "from pace_bench.batch import child_main; child_main()"
    result = run_child(code, [json.dumps(spec)], f"the {spec['workload']} workload")
    if "error" in result:
        raise PaceError(f"the {spec['workload']} workload failed: {result['error']}")
    return result


def specs(args: argparse.Namespace, model: str) -> list[dict[str, Any]]:
    """The workloads to run for one model, as child specs."""
    base = {"model": model, "dtype": args.dtype, "threads": args.threads, "check": args.check}
    out = []
    if "mixed" in args.workloads:
        out.append({**base, "workload": "mixed", "prompts": args.mixed_prompts,
                    "new_tokens": args.new_tokens})  # fmt: skip
    if "many" in args.workloads:
        out += [{**base, "workload": "many", "prompts": n, "tokens": args.many_tokens}
                for n in args.many_prompts]  # fmt: skip
    return out


def row(name: str, spec: dict[str, Any], m: dict[str, Any]) -> dict[str, Any]:
    batch1 = m["batch1_tok_s"]
    return {
        "model": name, "dtype": spec["dtype"], "workload": spec["workload"],
        "prompts": spec["prompts"], "prompt_tokens": m["prompt_tokens"],
        "output_tokens": m["output_tokens"], "seconds": round(m["seconds"], 2),
        "output_tok_s": round(m["output_tok_s"], 1),
        "batch1_tok_s": None if batch1 is None else round(batch1, 1),
        "vs_batch1": None if batch1 is None else round(m["output_tok_s"] / batch1, 2),
        "load_peak_rss_mb": round(m["load_peak"] / 1e6), "peak_rss_mb": round(m["peak"] / 1e6),
        "rss_after_mb": round(m["rss"] / 1e6), "checked": m["checked"],
        "identical": m["identical"],
    }  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    args.threads = args.threads or usable_cores() or os.cpu_count() or 1
    rows = []
    for name in args.models:
        path = str(model_path(name))
        for spec in progress(specs(args, path), name, args.quiet):
            rows.append(row(name, spec, measure(spec)))
    payload = emit("batch", rows, COLUMNS, args)
    summary = []
    many = [r["peak_rss_mb"] / 1e3 for r in rows if r["workload"] == "many"]
    if many:
        summary.append(ceiling_row("peak RSS of the many workload (GB)", many, args.max_rss_gb))
    checked = [r for r in rows if r["checked"]]
    if args.dtype == "float32" and checked:
        same = [r["identical"] / r["checked"] for r in checked]
        summary.append(target_row("float32 greedy tokens identical to one at a time", same, 1.0))
    return with_targets(payload, summary, args.quiet)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench batch [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("batch", argv)
