"""Serving benchmark: continuous batching vs one request at a time, same engine.

Starts ``pace serve`` itself (a subprocess bound to 127.0.0.1) once per mode, then drives it
with streaming /v1/completions requests at concurrency 1, 4, 16 and 32 (closed loop: each
client sends its next request when the previous one finished). Prompts and output lengths are
mixed (fixed seed; ``ignore_eos`` so every request produces exactly its max_tokens). Reports
request throughput, output tok/s, TTFT and inter-token latency p50/p99 per mode and level as
JSON + a table + a PNG plot (throughput and latencies vs concurrency).

    pace bench serving                      # both modes, all levels
    pace bench serving --quick              # concurrency 1, 4, 16 only

Every level is bounded in requests (``--requests-per-level``, at least the concurrency) and
in time (``--level-timeout``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

from pace_core.bench.common import emit, note, progress

_TEXT = (
    "the quick brown fox jumps over a lazy dog while seven curious engineers measure how "
    "fast a small language model answers many questions at once on two shared cores"
)
WORDS = _TEXT.split(" ")


MODES = {"continuous": (32, 1), "one-at-a-time": (1, 1), "2-instances": (16, 2)}
COLUMNS = [
    "mode",
    "concurrency",
    "requests",
    "failed",
    "wall_s",
    "req_per_s",
    "out_tok_per_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "e2e_p50_s",
]
QUICK = {"concurrency": [1, 4, 16]}


def make_workload(n: int, seed: int) -> list[tuple[str, int]]:
    """``n`` (prompt, max_tokens) pairs: prompts of ~8..200 words, outputs of 8..64 tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = rng.choice((8, 16, 32, 64, 128, 200))
        prompt = " ".join(rng.choice(WORDS) for _ in range(words))
        out.append((prompt, rng.choice((8, 16, 32, 48, 64))))
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m pace_core.cli serve`` on a free 127.0.0.1 port."""

    def __init__(self, args: argparse.Namespace, max_running: int, instances: int = 1) -> None:
        self.port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "pace_core.cli",
            "--log-level",
            "warning",
            "serve",
            args.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            args.dtype,
            "--max-running",
            str(max_running),
            "--max-queue",
            "1024",
            "--max-prefill-tokens",
            str(args.max_prefill_tokens),
            "--max-cache-tokens",
            str(args.max_cache_tokens),
            "--served-model-name",
            "bench",
        ]
        if instances > 1:
            cmd += ["--instances", str(instances)]
        elif args.threads:
            cmd += ["--threads", str(args.threads)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 300.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{err[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("server did not become ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


async def one_request(client: Any, url: str, prompt: str, max_tokens: int) -> dict:
    body = {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    stamps: list[float] = []
    tokens = 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return {"ok": False, "status": r.status_code}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            payload = json.loads(line[6:])
            if "error" in payload:
                return {"ok": False, "status": 200, "error": payload["error"]["message"]}
            if payload.get("usage"):
                tokens = payload["usage"]["completion_tokens"]
            elif payload.get("choices"):
                stamps.append(time.perf_counter())
    end = time.perf_counter()
    if not stamps:
        return {"ok": False, "status": 200}
    return {
        "ok": True,
        "ttft": stamps[0] - start,
        "itl": [b - a for a, b in itertools.pairwise(stamps)],
        "e2e": end - start,
        "tokens": tokens,
    }


async def run_level(
    url: str, workload: list[tuple[str, int]], concurrency: int, timeout: float
) -> dict[str, Any]:
    import httpx

    pending = list(workload)
    results: list[dict] = []
    limits = httpx.Limits(max_connections=concurrency + 4)

    async def worker(client: Any) -> None:
        while pending:
            prompt, max_tokens = pending.pop()
            results.append(await one_request(client, url, prompt, max_tokens))

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        tasks = [asyncio.create_task(worker(client)) for _ in range(concurrency)]
        _done, not_done = await asyncio.wait(tasks, timeout=timeout)
        for t in not_done:
            t.cancel()
        await asyncio.gather(*not_done, return_exceptions=True)
    wall = time.perf_counter() - start
    ok = [r for r in results if r["ok"]]
    ttft = [r["ttft"] for r in ok]
    itl = [x for r in ok for x in r["itl"]]
    tokens = sum(r["tokens"] for r in ok)
    return {
        "concurrency": concurrency,
        "requests": len(ok),
        "failed": len(results) - len(ok) + (len(workload) - len(results)),
        "wall_s": round(wall, 2),
        "req_per_s": round(len(ok) / wall, 3),
        "out_tok_per_s": round(tokens / wall, 1),
        "ttft_p50_ms": _ms(percentile(ttft, 0.5)),
        "ttft_p99_ms": _ms(percentile(ttft, 0.99)),
        "itl_p50_ms": _ms(percentile(itl, 0.5)),
        "itl_p99_ms": _ms(percentile(itl, 0.99)),
        "e2e_p50_s": round(statistics.median([r["e2e"] for r in ok]), 2) if ok else None,
    }


def _ms(x: float | None) -> float | None:
    return None if x is None else round(1000 * x, 1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=None, help="torch threads of the engine")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    p.add_argument("--requests-per-level", type=int, default=None, help="default: max(4, c)")
    p.add_argument("--level-timeout", type=float, default=600.0, help="seconds per level")
    p.add_argument("--max-prefill-tokens", type=int, default=512)
    p.add_argument("--max-cache-tokens", type=int, default=16384)
    p.add_argument(
        "--modes",
        nargs="+",
        default=["continuous", "one-at-a-time"],
        choices=list(MODES),
        help="continuous (--max-running 32), one-at-a-time (--max-running 1), "
        "2-instances (--instances 2, one core each)",
    )
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every mode and concurrency level against a fresh server; returns the JSON payload."""
    rows = []
    for mode in args.modes:
        max_running, instances = MODES[mode]
        server = ServerProcess(args, max_running, instances)
        try:
            server.wait_ready()
            # warm-up (not counted): first-call kernel set-up for batch-1 and batched shapes
            for c in (1, 4):
                asyncio.run(run_level(server.url, make_workload(4, 99), c, 300))
            for c in progress(args.concurrency, f"serving {mode}", args.quiet):
                n = args.requests_per_level or max(4, c)
                workload = make_workload(n, args.seed + c)
                row = asyncio.run(run_level(server.url, workload, c, args.level_timeout))
                rows.append({"mode": mode, **row})
        finally:
            server.stop()
    threads = args.threads or os.environ.get("OMP_NUM_THREADS", "torch default")
    note(args, f"serving: threads={threads} dtype={args.dtype} model={args.model}")
    return emit("serving", rows, COLUMNS, args)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench serving [argv]``: run, write the results folder, return the payload."""
    from pace_core.bench.cli import main_for

    return main_for("serving", argv)
