"""Tensor parallelism: the cost of its all-reduce per layer, and decode with 1 and N ranks.

Part 1 (always): ``--ranks`` processes, each pinned to its own core with one thread (the
launch plan of ``--instances ranks``), all-reduce ``[rows, hidden]`` tensors ``--repeats``
times each over gloo (TCP) and over pace's shared-memory exchange
(:mod:`pace_core.parallel.shm`); medians and 90th percentiles of one call, and per layer
(a layer all-reduces twice: after attention and after the MLP). ``rows`` 1 is a batch-1
decode step, 8 a batch-8 step, 128+ a prefill chunk.

Part 2 (``--decode``): batch-1 greedy decode tokens/s of a random Llama with SmolLM2-135M's
sizes made divisible (hidden 576, 8 heads of 72, 4 KV heads, intermediate 1536, 30 layers,
vocab 49152) in fp32 and bf16: one process (fused stack where the backend has one), and 2
ranks with each all-reduce.

Run it on an otherwise idle machine: the ranks spin while they wait for each other.

    pace bench tensor_parallel --hidden 576 2048 4096 --rows 1 8 128 --decode
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from pace_bench.common import emit, note
from pace_core.arg_types import at_least

COLUMNS = ["part", "backend", "dtype", "rows", "hidden", "kib", "us", "us_p90", "us_per_layer",
           "tok_s", "ms_per_token"]  # fmt: skip
QUICK = {"hidden": [576], "rows": [1, 128], "repeats": 200}
BACKENDS = ("gloo", "shm")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=at_least(1), default=2)
    p.add_argument("--hidden", nargs="+", type=at_least(1), default=[576, 2048, 4096])
    p.add_argument("--rows", nargs="+", type=at_least(1), default=[1, 8, 128])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--repeats", type=at_least(1), default=1000)
    p.add_argument("--decode", action="store_true", help="also time decode with 1 and N ranks")
    p.add_argument("--tokens", type=at_least(1), default=64, help="decoded tokens per --decode run")


def _rank(rank: int, size: int, port: int, shm: str, points: list, repeats: int, out) -> None:
    from pace_core.parallel.comm import Comm
    from pace_core.platform import current_topology
    from pace_core.platform.binding import apply_plan
    from pace_core.platform.placement import plan_instances

    apply_plan(plan_instances(current_topology(), size)[rank], f"rank {rank}")
    torch.set_num_threads(1)
    comm = Comm(rank, size, port=port, shm=Path(shm))
    rows = []
    for backend, dtype, n, hidden in points:
        x = torch.randn(n, hidden).to(getattr(torch, dtype))
        if backend == "gloo":

            def call(t=x):
                comm.pg.allreduce(t).wait()
        else:
            call = lambda t=x: comm.shm.all_reduce(t)  # noqa: E731
        for _ in range(min(50, repeats)):
            call()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        times.sort()
        rows.append((backend, dtype, n, hidden, statistics.median(times),
                     times[int(0.9 * (len(times) - 1))]))  # fmt: skip
    if rank == 0:
        out.put(rows)
    comm.close()


def allreduce_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch.distributed as dist

    from pace_core.parallel.shm import create_segment, segment_path

    points = [(b, d, n, h) for b in BACKENDS for d in args.dtypes for n in args.rows
              for h in args.hidden]  # fmt: skip
    shm = segment_path("bench")
    create_segment(shm, args.ranks)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    port = store.port
    del store  # the ranks meet on a store of their own, on this free port
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, args.ranks, port, str(shm), points, args.repeats,
                                             out)) for r in range(args.ranks)]  # fmt: skip
    for p in procs:
        p.start()
    got = out.get(timeout=3600)
    for p in procs:
        p.join(60)
    shm.unlink(missing_ok=True)
    rows = []
    for backend, dtype, n, hidden, med, p90 in got:
        kib = n * hidden * torch.empty(0, dtype=getattr(torch, dtype)).element_size() / 1024
        us, us_p90 = round(med * 1e6, 1), round(p90 * 1e6, 1)
        rows.append({"part": "all-reduce", "backend": backend, "dtype": dtype, "rows": n,
                     "hidden": hidden, "kib": round(kib, 1), "us": us, "us_p90": us_p90,
                     "us_per_layer": round(2 * us, 1)})  # fmt: skip
    return rows


def _decode_model(root: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    path = root / "smollm2-shaped"
    if (path / "config.json").exists():
        return path
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                      num_hidden_layers=30, num_attention_heads=8, num_key_value_heads=4,
                      head_dim=72, max_position_embeddings=2048, tie_word_embeddings=True,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def decode_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    from pace_core.engine.llm import LLMModel
    from pace_core.parallel.config import TensorParallelConfig
    from pace_core.sampling.config import SamplingConfig

    root = Path(tempfile.gettempdir()) / "pace-bench-tp"
    path = _decode_model(root)
    prompt = [torch.arange(1, 17)]
    cfg = SamplingConfig(max_new_tokens=args.tokens, do_sample=False)
    rows = []
    for dtype in args.dtypes:
        for backend in ("one process", *BACKENDS):
            tp = None if backend == "one process" else TensorParallelConfig(
                args.ranks, all_reduce=backend)  # fmt: skip
            if tp is None:
                torch.set_num_threads(1)
            llm = LLMModel(str(path), dtype=dtype, load_tokenizer=False, quiet=True,
                           tensor_parallel=tp)  # fmt: skip
            llm.generate(prompt, SamplingConfig(max_new_tokens=8, do_sample=False))
            runs = []
            for _ in range(3):
                start = time.perf_counter()
                llm.generate(prompt, cfg)
                runs.append(time.perf_counter() - start)
            llm.close()
            sec = statistics.median(runs)
            rows.append({"part": "decode", "backend": backend if tp else "1 rank, 1 thread",
                         "dtype": dtype, "rows": 1, "hidden": 576,
                         "tok_s": round(args.tokens / sec, 1),
                         "ms_per_token": round(1000 * sec / args.tokens, 2)})  # fmt: skip
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    note(args, f"tensor_parallel: load_average={os.getloadavg()}")
    rows = allreduce_rows(args)
    if args.decode:
        rows += decode_rows(args)
    return emit("tensor_parallel", rows, COLUMNS, args)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench tensor_parallel [argv]``: run, write the results folder, return it."""
    from pace_bench.cli import main_for

    return main_for("tensor_parallel", argv)
