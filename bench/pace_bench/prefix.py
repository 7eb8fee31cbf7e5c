"""Prefix caching: time to first token of a chat request whose long system prompt is cached.

Per engine (``--engines``: ``pace``, ``pace-nocache`` = ``pace serve --no-prefix-caching``,
``pace-restart``, ``vllm``), one server on the same model and cores: ``--repeats`` *cold*
requests (each with a system prompt never seen before) and ``--repeats`` *warm* ones (the same
system prompt as an earlier request, a different user question), alternating, streamed
``/v1/chat/completions`` with ``max_tokens`` 8 at temperature 0. ``pace-restart`` is
``pace serve --prefix-cache-dir``: the warm prompts are sent to a first server, which is
stopped; each warm request is then the *first* request with its prompt on a restarted server
(its blocks come from disk). Reports median TTFT of both, their ratio (target:
warm >= 5x faster for a ~1,500-token system prompt), the cached tokens the server reports in
``usage.prompt_tokens_details`` and whether the warm answers equal the cold answers of the
same messages on a server without caching.

    pace bench prefix --engines pace pace-nocache vllm --system-tokens 1500
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from pace_bench.common import emit, model_path, note, progress, target_row, with_targets
from pace_bench.peers import PeerUnavailable
from pace_bench.serving_peers import (
    EngineServer,
    ServerSpec,
    pace_spec,
    vllm_spec,
)
from pace_core.arg_types import above, at_least

COLUMNS = ["engine", "system_tokens", "ttft_cold_ms", "ttft_warm_ms", "speedup",
           "cached_tokens", "answers"]  # fmt: skip
QUICK = {"repeats": 2, "system_tokens": 600}
_WORDS = ["policy", "account", "refund", "shipping", "order", "customer", "invoice", "warranty",
          "return", "product", "support", "ticket", "agent", "escalation", "priority",
          "response", "delivery", "billing", "address"]  # fmt: skip
QUESTIONS = ["Where is my order?", "How do I get a refund?", "Can I change my address?",
             "What is the warranty?", "Who do I call for billing?",
             "Is shipping free?"]  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["smollm2"])
    p.add_argument("--engines", nargs="+", default=["pace", "pace-nocache"],
                   choices=["pace", "pace-nocache", "pace-restart", "vllm"])  # fmt: skip
    p.add_argument("--system-tokens", type=at_least(1), default=1500)
    p.add_argument("--repeats", type=at_least(1), default=5)
    p.add_argument("--threads", type=at_least(1), default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--start-timeout", type=above(0), default=600.0)


def system_prompt(tokenizer: Any, tokens: int, seed: int) -> str:
    """A support-desk policy text of about ``tokens`` tokens, different for every seed."""
    rng = random.Random(seed)
    words = [f"Policy {seed}: you are a support agent."]
    while len(tokenizer(" ".join(words))["input_ids"]) < tokens:
        words += [rng.choice(_WORDS) for _ in range(50)]
    return " ".join(words)


def chat(client: httpx.Client, url: str, model: str, system: str, question: str) -> dict[str, Any]:
    """One streamed chat request on ``client`` (kept across requests: making
    one costs ~30 ms, which a TTFT must not include): TTFT (s), the answer and the cached prompt
    tokens."""
    body = {
        "model": model, "max_tokens": 8, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }  # fmt: skip
    start, first, text, cached = time.perf_counter(), None, "", None
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            payload = json.loads(line[6:])
            for choice in payload.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece and first is None:
                    first = time.perf_counter()
                text += piece or ""
            usage = payload.get("usage") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", cached)
    return {"ttft": (first or time.perf_counter()) - start, "text": text, "cached": cached}


def spec_for(
    engine: str, model_dir: Path, args: argparse.Namespace, cache_dir: str | None = None
) -> ServerSpec:
    if engine == "vllm":
        return vllm_spec(model_dir, dtype=args.dtype, threads=args.threads or 1, max_running=4,
                         max_model_len=4096)  # fmt: skip
    extra = ["--no-prefix-caching"] if engine == "pace-nocache" else []
    if cache_dir is not None:
        extra = ["--prefix-cache-dir", cache_dir]
    return pace_spec(model_dir, dtype=args.dtype, threads=args.threads, max_running=4,
                     max_prefill_tokens=2048, extra=extra)  # fmt: skip


def measure_restart(model_dir: Path, args: argparse.Namespace, systems: list[str]) -> dict:
    """``pace-restart``: a first server caches the warm prompts (and spills them when it
    stops); on a restarted server over the same directory, cold requests alternate with the
    first request of each warm prompt."""
    import tempfile

    warm_systems = systems[args.repeats + 1 :]
    with tempfile.TemporaryDirectory(prefix="pace-bench-kv-") as cache_dir:
        first = EngineServer(spec_for("pace", model_dir, args, cache_dir))
        try:
            first.wait_ready(args.start_timeout)
            with httpx.Client(timeout=600) as client:
                for system in warm_systems:
                    chat(client, first.url, first.spec.model_id, system, QUESTIONS[0])
        finally:
            first.stop()
        server = EngineServer(spec_for("pace", model_dir, args, cache_dir))
        try:
            server.wait_ready(args.start_timeout)
            cold, warm = [], []
            with httpx.Client(timeout=600) as client:
                for i in range(args.repeats):
                    cold.append(chat(client, server.url, server.spec.model_id, systems[1 + i],
                                     QUESTIONS[0]))  # fmt: skip
                    warm.append(chat(client, server.url, server.spec.model_id, warm_systems[i],
                                     QUESTIONS[1 + i % 5]))  # fmt: skip
        finally:
            server.stop()
    return {"cold": cold, "warm": warm}


def measure(engine: str, model_dir: Path, args: argparse.Namespace, systems: list[str]) -> dict:
    """Cold and warm requests on one fresh server of ``engine``."""
    if engine == "pace-restart":
        return measure_restart(model_dir, args, systems)
    spec = spec_for(engine, model_dir, args)
    server = EngineServer(spec)
    try:
        server.wait_ready(args.start_timeout)
        shared = systems[0]
        cold, warm = [], []
        with httpx.Client(timeout=600) as client:
            chat(client, server.url, spec.model_id, shared, QUESTIONS[0])  # the prefix is cached
            for i in range(args.repeats):
                cold.append(chat(client, server.url, spec.model_id, systems[1 + i], QUESTIONS[0]))
                warm.append(chat(client, server.url, spec.model_id, shared, QUESTIONS[1 + i % 5]))
    finally:
        server.stop()
    return {"cold": cold, "warm": warm}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    rows: list[dict[str, Any]] = []
    speedups: dict[str, list[float]] = {}
    for name in progress(args.models, "prefix", args.quiet):
        model_dir = model_path(name)
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        count = 2 * args.repeats + 1  # the shared one, the cold ones, pace-restart's warm ones
        systems = [system_prompt(tokenizer, args.system_tokens, s) for s in range(count)]
        results: dict[str, dict] = {}
        for engine in args.engines:
            try:
                results[engine] = measure(engine, model_dir, args, systems)
            except PeerUnavailable as exc:
                note(args, f"prefix: {engine} skipped: {exc}")
        reference = results.get("pace-nocache")
        for engine, r in results.items():
            cold = statistics.median(x["ttft"] for x in r["cold"])
            warm = statistics.median(x["ttft"] for x in r["warm"])
            same = None
            if reference is not None and engine != "pace-restart":  # other prompts
                same = all(a["text"] == b["text"] for a, b in zip(r["warm"], reference["warm"]))
            rows.append({
                "engine": engine, "system_tokens": args.system_tokens,
                "ttft_cold_ms": round(cold * 1e3, 1), "ttft_warm_ms": round(warm * 1e3, 1),
                "speedup": round(cold / warm, 2),
                "cached_tokens": r["warm"][-1]["cached"],
                "answers": "n/a" if same is None else ("same" if same else "DIFFER"),
            })  # fmt: skip
            if engine in ("pace", "pace-restart"):
                speedups.setdefault(engine, []).append(cold / warm)
    payload = emit("prefix", rows, COLUMNS, args)
    summary = [
        target_row(f"{engine} warm / cold TTFT speedup", values, 5.0)
        for engine, values in speedups.items()
    ]
    return with_targets(payload, summary, args.quiet)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench prefix [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("prefix", argv)
