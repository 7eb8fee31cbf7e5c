"""Structured outputs: decode speed with a grammar vs without, same engine, same run.

Per model and batch size, greedy chat generation under a JSON schema (``--schema``, default an
unbounded list of records so every row decodes its whole budget) and the same prompts
unconstrained with ``ignore_eos`` to the same length. Decode time is the time of
``max_tokens`` tokens minus the time of 1 token (the same prefill), timed round-robin
(:func:`~pace_bench.common.interleaved`), medians. Target (issue "serving features"):
decode tok/s with a grammar >= 0.9x without.

    pace bench structured --models smollm2 --batches 1 8
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import torch

from pace_bench.common import (
    emit,
    interleaved,
    model_path,
    note,
    progress,
    target_row,
    with_targets,
)
from pace_core.arg_types import at_least

COLUMNS = ["model", "batch", "tokens", "free_tok_s", "grammar_tok_s", "ratio", "valid_prefix"]
QUICK = {"batches": [1], "tokens": 32, "repeats": 2}
RECORDS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}},
        },
        "required": ["id", "name", "tags"],
        "additionalProperties": False,
    },
}
ASK = "List many product records as JSON: an id, a name and colour tags each."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["smollm2"])
    p.add_argument("--batches", nargs="+", type=at_least(1), default=[1, 8])
    p.add_argument("--tokens", type=at_least(1), default=96, help="tokens decoded per row")
    p.add_argument("--repeats", type=at_least(1), default=5)
    p.add_argument("--threads", type=at_least(1), default=None)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--schema", default=None, help="a JSON schema file (default: RECORDS)")


def _decode_rate(times: dict[str, list[float]], batch: int, tokens: int) -> float:
    """Decoded tokens per second from the medians of the full and 1-token runs."""
    full, first = statistics.median(times["full"]), statistics.median(times["first"])
    return batch * (tokens - 1) / max(full - first, 1e-9)


def measure(llm: Any, schema: dict[str, Any], batch: int, tokens: int, repeats: int) -> dict:
    from pace_core.sampling import SamplingConfig

    prompts = [[{"role": "user", "content": ASK}]] * batch
    constrained = SamplingConfig(max_new_tokens=tokens, json_schema=schema)
    probe = llm.generate(prompts, constrained)
    n = min(len(s.token_ids) for s in probe.sequences)
    if n < 2:
        raise RuntimeError(f"the schema ended generation after {n} token(s): use a longer one")
    free = SamplingConfig(max_new_tokens=n, ignore_eos=True)
    runs = {
        "grammar": {
            "full": lambda: llm.generate(prompts, constrained.merged(max_new_tokens=n)),
            "first": lambda: llm.generate(prompts, constrained.merged(max_new_tokens=1)),
        },
        "free": {
            "full": lambda: llm.generate(prompts, free),
            "first": lambda: llm.generate(prompts, free.merged(max_new_tokens=1)),
        },
    }
    flat = {f"{k}/{part}": fn for k, parts in runs.items() for part, fn in parts.items()}
    times = interleaved(flat, repeats)
    rate = {
        k: _decode_rate({p: times[f"{k}/{p}"] for p in ("full", "first")}, batch, n) for k in runs
    }
    valid = all(_json_prefix(s.text) for s in probe.sequences)
    return {"tokens": n, "free": rate["free"], "grammar": rate["grammar"], "valid": valid}


def _json_prefix(text: str) -> bool:
    """``text`` is a complete JSON document, or a prefix cut by the token budget."""
    try:
        json.loads(text)
        return True
    except ValueError as exc:
        return "Unterminated" in str(exc) or "Expecting" in str(exc)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pace_core.engine.llm import LLMModel

    schema = RECORDS
    if args.schema:
        with open(args.schema) as f:
            schema = json.load(f)
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows, ratios = [], []
    try:
        for name in progress(args.models, "structured", args.quiet):
            llm = LLMModel(model_path(name), dtype=getattr(torch, args.dtype), quiet=True)
            for batch in args.batches:
                m = measure(llm, schema, batch, args.tokens, args.repeats)
                ratio = m["grammar"] / m["free"]
                ratios.append(ratio)
                rows.append({
                    "model": name, "batch": batch, "tokens": m["tokens"],
                    "free_tok_s": round(m["free"], 1), "grammar_tok_s": round(m["grammar"], 1),
                    "ratio": round(ratio, 3), "valid_prefix": m["valid"],
                })  # fmt: skip
        note(args, f"structured: torch threads {torch.get_num_threads()}")
    finally:
        torch.set_num_threads(threads)
    payload = emit("structured", rows, COLUMNS, args)
    return with_targets(payload, [target_row("grammar / free decode", ratios, 0.9)], args.quiet)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench structured [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("structured", argv)
