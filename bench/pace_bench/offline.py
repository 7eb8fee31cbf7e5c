"""Offline generation: pace vs the peers installed here (transformers, llama.cpp), one run.

For each sweep point (threads, batch, prompt length) every engine generates greedily from the
same random prompt: time to first token (prefill + one token) and the whole generation are
timed round-robin across engines, and the medians give TTFT, prefill tok/s, decode tok/s
(pace: the tokens after every prompt's first over the time after it, clocked inside each
run; the peers: tokens after the first over the whole run's time less the TTFT run's) and
total tok/s, with pace / transformers
ratios. The sweep varies one axis at a time from the first value of each list (``--grid``:
every combination). llama.cpp (llama-cpp-python, ``make bench-peers``) runs a BF16 GGUF
converted from the same checkpoint, batch 1 only; it is skipped with a note when absent.
``--kv-cache-types`` runs pace once per cache type (engines ``pace[dynamic]``,
``pace[paged]``, ...; each timed in the same rounds, with its ratio to the first type); a
type may name its KV storage dtype, ``paged:int8`` (``kv_cache_dtype``).

    pace bench offline --models smollm2 gemma3-270m --threads 1 2 --batches 1 8
    pace bench offline --prompt-lens 32 128 512 --engines pace llama.cpp
    pace bench offline --engines pace --kv-cache-types dynamic paged slab_pool
    pace bench offline --engines pace --kv-cache-types paged paged:int8 --batches 8 \
        --prompt-lens 4000 --threads 2
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from pace_bench.common import (
    emit,
    interleaved,
    model_path,
    note,
    progress,
    random_prompts,
    vocab_size,
)
from pace_core.arg_types import at_least

ENGINES = ("pace", "transformers", "llama.cpp")
GGUF_TYPES = {"bfloat16": "bf16", "float32": "f32"}
COLUMNS = [
    "model",
    "engine",
    "kv_cache",
    "threads",
    "batch",
    "prompt_len",
    "ttft_s",
    "prefill_tok_s",
    "decode_tok_s",
    "total_tok_s",
    "decode_vs_hf",
    "prefill_vs_hf",
    "decode_vs_first_cache",
    "prefill_vs_first_cache",
]
QUICK = {
    "threads": [1],
    "batches": [1, 4],
    "prompt_lens": [32, 128],
    "new_tokens": 16,
    "repeats": 2,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["smollm2"], help="zoo names or directories")
    p.add_argument("--dtype", default="bfloat16", choices=list(GGUF_TYPES))
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--opconfig", default=None, help="pace's OperatorConfig (default: auto)")
    p.add_argument(
        "--kv-cache-types",
        nargs="+",
        default=["dynamic"],
        help="pace's KV cache types, each a pace engine of its own (ratios vs the first); "
        "TYPE:int8 for an int8 KV cache",
    )
    p.add_argument("--threads", nargs="+", type=at_least(1), default=[1, 2])
    p.add_argument("--batches", nargs="+", type=at_least(1), default=[1, 8])
    p.add_argument("--prompt-lens", nargs="+", type=at_least(1), default=[128, 512])
    p.add_argument("--grid", action="store_true", help="every combination, not one axis at a time")
    p.add_argument("--new-tokens", type=at_least(1), default=128)
    p.add_argument("--repeats", type=at_least(1), default=3)


def sweep_points(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    """(threads, batch, prompt_len) points: the grid, or each axis varied from the base."""
    axes = (args.threads, args.batches, args.prompt_lens)
    if args.grid:
        return list(itertools.product(*axes))
    base = tuple(a[0] for a in axes)
    points = [base]
    for i, values in enumerate(axes):
        points += [(*base[:i], v, *base[i + 1 :]) for v in values[1:]]
    return list(dict.fromkeys(points))


class PaceRunner:
    """Exactly ``new_tokens`` greedy tokens per prompt of ``ids`` through ``model.stream``.
    ``ignore_eos`` is pace's way of not stopping, as transformers' is ``min_new_tokens`` and
    llama.cpp's runner never checks EOS; pace's ``min_new_tokens`` would add a logits
    processor (a copy of the logits per step) that llama.cpp's runner does not run.

    Each call clocks its own decode too (``decode_rates``): the tokens that come after every
    prompt has its first, over the time after that moment. :func:`measure_point` takes that
    rather than the difference of two timed calls, which at long prompts is a small number
    between two large noisy ones (4 x 2,000 tokens: a 40 s prefill against a 3.5 s decode,
    the prefill's spread between runs as large as the decode)."""

    def __init__(self, model: Any, ids: torch.Tensor, new_tokens: int) -> None:
        from pace_core import SamplingConfig

        self.model, self.ids = model, ids
        self.config = SamplingConfig(max_new_tokens=new_tokens, ignore_eos=True)
        self.decode_rates: list[float] = []

    def __call__(self) -> None:
        rows = self.ids.shape[0] if self.ids.dim() == 2 else 1
        started: set[int] = set()
        start, after = 0.0, 0
        for chunk in self.model.stream(self.ids, self.config):
            if len(started) < rows:
                started.add(chunk.index)
                if len(started) == rows:
                    start = time.perf_counter()
            else:
                after += 1
        if after:
            self.decode_rates.append(after / (time.perf_counter() - start))


def pace_runner(model: Any, ids: torch.Tensor, new_tokens: int) -> PaceRunner:
    """:class:`PaceRunner` of ``model`` (``make(ids, n)`` of :func:`measure_point`)."""
    return PaceRunner(model, ids, new_tokens)


def transformers_runner(model: Any, ids: torch.Tensor, new_tokens: int) -> Callable[[], Any]:
    def go() -> None:
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=0,
            )

    return go


class LlamaCppRunner:
    """llama.cpp runners over the model's GGUF, one per thread count and batch size (batches
    of several sequences decode together in one context)."""

    def __init__(self, gguf: Any, n_ctx: int) -> None:
        self.gguf, self.n_ctx, self.runners = gguf, n_ctx, {}

    def __call__(self, ids: torch.Tensor, new_tokens: int) -> Callable[[], Any]:
        from pace_bench.peers import LlamaCppBatchRunner, LlamaCppRunner

        threads, batch = torch.get_num_threads(), ids.shape[0]
        key = (threads, batch)
        if key not in self.runners:
            self.runners[key] = (
                LlamaCppRunner(self.gguf, threads, self.n_ctx) if batch == 1
                else LlamaCppBatchRunner(self.gguf, threads, batch, self.n_ctx)
            )  # fmt: skip
        runner = self.runners[key]
        if batch == 1:
            tokens = ids[0].tolist()
            return lambda: runner.generate(tokens, new_tokens)
        prompts = ids.tolist()
        return lambda: runner.generate(prompts, new_tokens)


def pace_label(cache: str, args: argparse.Namespace) -> str:
    """``pace`` for the default cache alone, else ``pace[<cache type>]``."""
    return "pace" if list(args.kv_cache_types) == ["dynamic"] else f"pace[{cache}]"


def load_engines(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """engine -> ``make(ids, new_tokens) -> fn`` for one model; unavailable peers noted."""
    from pace_core import LLMModel

    path, dtype = model_path(name), getattr(torch, args.dtype)
    engines: dict[str, Any] = {}
    if "pace" in args.engines:
        for cache in args.kv_cache_types:
            # prefix caching off: the same prompt runs every repeat, and a block cache would
            # serve it from its prefix cache instead of prefilling it (measured: "prefill"
            # 5.9x dynamic's on paged)
            kind, _, kv = cache.partition(":")
            pace = LLMModel(path, dtype=dtype, opconfig=args.opconfig, kv_cache_type=kind,
                            kv_cache_dtype=kv or None, quiet=True, load_tokenizer=False,
                            prefix_caching=False)  # fmt: skip
            engines[pace_label(cache, args)] = lambda ids, n, m=pace: pace_runner(m, ids, n)
    if "transformers" in args.engines:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        if args.quiet:
            hf_logging.disable_progress_bar()

        hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
        engines["transformers"] = lambda ids, n: transformers_runner(hf, ids, n)
    if "llama.cpp" in args.engines:
        from pace_bench import peers

        try:
            if peers.find_llama_cpp() is None:
                raise peers.PeerUnavailable("llama-cpp-python is not installed (make bench-peers)")
            gguf = peers.gguf_for(path, GGUF_TYPES[args.dtype])
            engines["llama.cpp"] = LlamaCppRunner(gguf, max(args.prompt_lens) + args.new_tokens + 8)
        except peers.PeerUnavailable as exc:
            note(args, f"offline: llama.cpp skipped: {exc}")
    return engines


def measure_point(engines: dict[str, Any], ids: torch.Tensor, args) -> dict[str, dict]:
    """TTFT and generation time of every engine, timed round-robin; derived rates. A fn with a
    ``reported`` list of seconds (a peer's own clock) is timed by that list instead; a
    generation fn with ``decode_rates`` (pace's :class:`PaceRunner`) gives the decode rate
    from its own clock, the others tokens after the first over the time after it."""
    batch, prompt_len = ids.shape
    fns = {}
    for engine, make in engines.items():
        fns[(engine, "ttft")] = make(ids, 1)
        fns[(engine, "total")] = make(ids, args.new_tokens)
    times = interleaved(fns, args.repeats)
    for key, fn in fns.items():  # a peer timed by its own clock (llama-bench), warm-up dropped
        if hasattr(fn, "reported"):
            times[key] = fn.reported[-args.repeats :]
    out = {}
    for engine in engines:
        ttft = statistics.median(times[(engine, "ttft")])
        total = statistics.median(times[(engine, "total")])
        clocked = getattr(fns[(engine, "total")], "decode_rates", None)
        decode = (statistics.median(clocked[-args.repeats :]) if clocked
                  else batch * (args.new_tokens - 1) / max(total - ttft, 1e-9))  # fmt: skip
        out[engine] = {
            "ttft_s": ttft,
            "prefill_tok_s": batch * prompt_len / ttft,
            "decode_tok_s": decode,
            "total_tok_s": batch * args.new_tokens / total,
        }
    hf = out.get("transformers")
    for r in out.values():
        if hf:
            r["decode_vs_hf"] = r["decode_tok_s"] / hf["decode_tok_s"]
            r["prefill_vs_hf"] = r["prefill_tok_s"] / hf["prefill_tok_s"]
    return out


def with_cache_ratios(out: dict[str, dict], args: argparse.Namespace) -> dict[str, dict]:
    """With several ``--kv-cache-types``: each pace cache's rates relative to the first's."""
    caches = [pace_label(c, args) for c in args.kv_cache_types]
    first = out.get(caches[0]) if len(caches) > 1 else None
    for engine, r in out.items():
        if first and engine in caches:
            r["decode_vs_first_cache"] = r["decode_tok_s"] / first["decode_tok_s"]
            r["prefill_vs_first_cache"] = r["prefill_tok_s"] / first["prefill_tok_s"]
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every model and sweep point; returns the JSON payload."""
    rows = []
    points = sweep_points(args)
    for name in args.models:
        engines = load_engines(name, args)
        vocab = vocab_size(model_path(name))
        gen = torch.Generator().manual_seed(0)
        for threads, batch, prompt_len in progress(points, f"offline {name}", args.quiet):
            torch.set_num_threads(threads)
            ids = random_prompts(vocab, batch, prompt_len, gen)
            caches = {pace_label(c, args): c for c in args.kv_cache_types}
            for engine, r in with_cache_ratios(measure_point(engines, ids, args), args).items():
                rows.append(
                    {
                        "model": name,
                        "engine": engine,
                        "kv_cache": caches.get(engine),
                        "threads": threads,
                        "batch": batch,
                        "prompt_len": prompt_len,
                        "dtype": args.dtype,
                        **r,
                    }
                )
    return emit("offline", rows, COLUMNS, args)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench offline [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("offline", argv)
