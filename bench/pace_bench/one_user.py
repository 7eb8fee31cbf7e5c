"""One user: pace's served decode against its own offline batch-1 decode, measured in pairs.

Per model: one ``pace serve`` (paged cache, ``--threads``) and the same model loaded offline
in this process on as many threads. ``--pairs`` times, alternating which goes first, one
offline greedy stream (``LLMModel.stream``) and one streamed ``/v1/completions`` request to
the server, each of ``--new-tokens`` tokens from the same kind of ``--prompt-tokens`` prompt
(the serving benchmark's fixed workload); each side is idle while the other runs. A side's
speed is its decode alone: the time from its first to its last token over the tokens in
between (no time to first token). A pair's ratio is served speed over offline speed, so the
host's drift between pairs (these machines are shared) cancels within a pair. Targets: the
median ratio >= 0.97 (served decode at least 0.97x offline batch-1 decode), and the served
stream's time between tokens steady: its p99 over all pairs <= 1.5x its median.

Both sides share the machine's cores, so the served stream pays for the CPU that runs
beside its forward: the client's (``client_cpu_ms_per_token``) and the server's event loop
(``server_loop_cpu_ms_per_token``: the CPU time of the server process's main thread, which
runs the HTTP loop, per served token; Linux only).

    pace bench one_user --models smollm2 gemma3-270m --pairs 10
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pace_bench.common import (
    emit,
    model_path,
    progress,
    target_row,
    usable_cores,
    with_targets,
)
from pace_bench.serving import make_fixed_workload, one_request
from pace_bench.serving_peers import EngineServer, pace_spec
from pace_bench.sse_client import run as run_async
from pace_core.arg_types import above, at_least

COLUMNS = ["model", "threads", "pairs", "offline_ms_per_token", "served_ms_per_token",
           "ratio_median", "ratio_min", "ratio_max", "served_itl_p50_ms", "served_itl_p99_ms",
           "itl_p99_over_p50", "offline_p99_over_p50", "client_cpu_ms_per_token",
           "server_loop_cpu_ms_per_token"]  # fmt: skip
QUICK = {"pairs": 3, "new_tokens": 16, "prompt_tokens": 32}
TARGET = 0.97
ITL_SPREAD_TARGET = 1.5  # served ITL p99 / p50, at most


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["smollm2"])
    p.add_argument("--pairs", type=at_least(1), default=10)
    p.add_argument("--prompt-tokens", type=at_least(1), default=150)
    p.add_argument("--new-tokens", type=at_least(1), default=64)
    p.add_argument("--threads", type=at_least(1), default=None, help="default: all usable cores")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--start-timeout", type=above(0), default=600.0)


def per_token(gaps: list[float]) -> float:
    """Seconds per decoded token from the gaps between a stream's tokens."""
    if not gaps:
        raise RuntimeError("a stream gave fewer than 2 tokens; timing a decode needs at least 2")
    return sum(gaps) / len(gaps)


def served_gaps(url: str, prompt: str, new_tokens: int) -> tuple[list[float], float]:
    """The gaps between the tokens of one streamed greedy completion (the serving benchmark's
    request, with ``ignore_eos`` as offline) and the CPU seconds the client spent on it."""
    cpu = time.thread_time()
    result = run_async(one_request(url, prompt, new_tokens))
    cpu = time.thread_time() - cpu
    if not result["ok"]:
        raise RuntimeError(f"the server failed a request: {result['status']} {result['error']}")
    return result["itl"], cpu


def thread_cpu_seconds(pid: int, tid: int | None = None) -> float | None:
    """CPU seconds thread ``tid`` (default: the main thread) of process ``pid`` has run:
    ``/proc`` schedstat (nanoseconds), else its stat ticks; None where neither exists."""
    task = Path(f"/proc/{pid}/task/{tid or pid}")
    try:
        return int((task / "schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        stat = (task / "stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def offline_gaps(llm: Any, ids: list[int], new_tokens: int) -> list[float]:
    """The gaps between the tokens of one offline greedy stream."""
    import torch

    from pace_core import SamplingConfig

    cfg = SamplingConfig(max_new_tokens=new_tokens, ignore_eos=True)
    stamps = [time.perf_counter() for _ in llm.stream(torch.tensor([ids]), cfg)]
    return [b - a for a, b in itertools.pairwise(stamps)]


@dataclass
class Measured:
    """One model's pairs of seconds per token (offline, served), every gap between two
    tokens on each side (the offline spread shows the host's own) and the CPU seconds per
    served token of the client and of the server's event loop."""

    pairs: list[tuple[float, float]] = field(default_factory=list)
    served_gaps: list[float] = field(default_factory=list)
    offline_gaps: list[float] = field(default_factory=list)
    client_cpu: list[float] = field(default_factory=list)  # per served token, each request
    server_cpu: list[float] = field(default_factory=list)  # the server's loop, the same way


def measure(model_dir: Path, args: argparse.Namespace) -> Measured:
    """``args.pairs`` offline and served streams on one model, in turns (see the module doc)."""
    import torch

    from pace_core import LLMModel

    torch.set_num_threads(args.threads)
    llm = LLMModel(model=str(model_dir), dtype=args.dtype, kv_cache_type="paged", quiet=True)

    def count(text: str) -> int:
        return len(llm.tokenizer(text)["input_ids"])

    prompts = [p for p, _ in make_fixed_workload(2 * args.pairs + 2, 7, args.prompt_tokens,
                                                 args.new_tokens, count)]  # fmt: skip
    spec = pace_spec(model_dir, dtype=args.dtype, threads=args.threads, max_running=4)
    server = EngineServer(spec)
    got = Measured()
    try:
        server.wait_ready(args.start_timeout)

        def offline(prompt: str) -> float:
            gaps = offline_gaps(llm, llm.tokenizer(prompt)["input_ids"], args.new_tokens)
            got.offline_gaps.extend(gaps)
            return per_token(gaps)

        def served(prompt: str) -> float:
            loop = thread_cpu_seconds(server.proc.pid)
            gaps, cpu = served_gaps(server.url, prompt, args.new_tokens)
            after = thread_cpu_seconds(server.proc.pid)
            got.served_gaps.extend(gaps)
            got.client_cpu.append(cpu / (len(gaps) + 1))
            if loop is not None and after is not None:
                got.server_cpu.append((after - loop) / (len(gaps) + 1))
            return per_token(gaps)

        offline_gaps(llm, llm.tokenizer(prompts[-1])["input_ids"], args.new_tokens)  # warm
        served_gaps(server.url, prompts[-2], args.new_tokens)
        for i in progress(range(args.pairs), model_dir.name, args.quiet):
            a, b = prompts[2 * i], prompts[2 * i + 1]
            if i % 2:
                s, o = served(a), offline(b)
            else:
                o, s = offline(a), served(b)
            got.pairs.append((o, s))
    finally:
        server.stop()
    return got


def run(args: argparse.Namespace) -> dict[str, Any]:
    args.threads = args.threads or usable_cores() or os.cpu_count() or 1
    rows, medians, spreads = [], [], []
    for name in args.models:
        got = measure(model_path(name), args)
        pairs, gaps, offline = got.pairs, got.served_gaps, got.offline_gaps
        ratios = [o / s for o, s in pairs]
        p50, p99 = statistics.median(gaps), statistics.quantiles(gaps, n=100)[98]
        offline_spread = statistics.quantiles(offline, n=100)[98] / statistics.median(offline)
        rows.append({
            "model": name, "threads": args.threads, "pairs": len(pairs),
            "offline_ms_per_token": round(1e3 * statistics.median(o for o, _ in pairs), 2),
            "served_ms_per_token": round(1e3 * statistics.median(s for _, s in pairs), 2),
            "ratio_median": round(statistics.median(ratios), 3),
            "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3),
            "served_itl_p50_ms": round(1e3 * p50, 2), "served_itl_p99_ms": round(1e3 * p99, 2),
            "itl_p99_over_p50": round(p99 / p50, 2),
            "offline_p99_over_p50": round(offline_spread, 2),
            "client_cpu_ms_per_token": round(1e3 * statistics.median(got.client_cpu), 3),
            "server_loop_cpu_ms_per_token": (round(1e3 * statistics.median(got.server_cpu), 3)
                                             if got.server_cpu else None),
            "pairs_ms": [[round(1e3 * o, 2), round(1e3 * s, 2)] for o, s in pairs],
        })  # fmt: skip
        medians.append(statistics.median(ratios))
        spreads.append(p50 / p99)  # a target row reads "at least": p50/p99 >= 1/1.5
    payload = emit("one_user", rows, COLUMNS, args)
    summary = [
        target_row("served / offline batch-1 decode (median of pairs)", medians, TARGET),
        target_row("served ITL p50 / p99 (p99 <= 1.5x p50)", spreads, 1 / ITL_SPREAD_TARGET),
    ]
    return with_targets(payload, summary, args.quiet)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench one_user [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("one_user", argv)
