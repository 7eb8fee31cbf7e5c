"""Scoring: prompt tokens scored per second by pace (offline and served) and transformers.

Scoring a text is lm-evaluation-harness's loglikelihood request: the log-probability of each
of its tokens given the ones before it. Per model, batch size (``--batches``, prompts per call)
and prompt length (``--lengths``, tokens), every engine scores the same token ids (random
English words, a different text per row), timed round-robin
(:func:`~pace_bench.common.interleaved_results`), medians:

- ``pace-bf16``, ``pace-fp32``: ``LLMModel.generate`` with ``prompt_logprobs`` and one new
  token (through the engine core: each prompt scored in its own prefill);
- ``pace-served``: ``pace serve`` (bf16) answering one ``/v1/completions`` request per call
  with the batch as its ``prompt`` list, ``echo``, ``logprobs`` 0 and ``max_tokens`` 0 -- what
  lm-evaluation-harness's ``local-completions`` model sends;
- ``transformers``: fp32 ``AutoModelForCausalLM`` run eagerly (``--hf-attn``) on the batch,
  ``log_softmax`` of its logits at every position.

Each row reports the engine's scored tokens/s (``length - 1`` a prompt: the first token has no
score), its speed against transformers and its largest and mean absolute difference to
transformers' log-probabilities (a correctness check). Targets: pace fp32 differs by at most
0.01 anywhere, bf16 by at most 0.1 on average (transformers' own bf16 model is 0.05-0.08 from
its fp32 here).

    pace bench scoring --batches 1 8 --lengths 128 512 --engines pace-bf16 pace-served transformers
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from pace_core.arg_types import above, at_least

if TYPE_CHECKING:
    import httpx

from pace_bench.common import (
    ceiling_row,
    emit,
    interleaved_results,
    make_texts,
    model_path,
    note,
    progress,
    with_targets,
)

ENGINES = ("pace-bf16", "pace-fp32", "pace-served", "transformers")
COLUMNS = ["model", "batch", "length", "engine", "tokens_s", "ms", "vs_hf", "max_abs_diff",
           "mean_abs_diff"]  # fmt: skip
QUICK = {"batches": [1, 4], "lengths": [32], "repeats": 2}
# largest |logprob - transformers'| anywhere: fp32 in another summation order (SmolLM2: 4e-5 at
# 128 tokens, 2e-3 at 512)
MAX_DIFF = {"pace-fp32": 0.01}
# mean |logprob - transformers'|: bf16 weights and activations against fp32 (transformers' own
# bf16 model is 0.05-0.08 from its fp32 on these texts, SmolLM2, 32-512 tokens)
MEAN_DIFF = {"pace-bf16": 0.1, "pace-served": 0.1}
Scorer = Callable[[torch.Tensor], torch.Tensor]
"""``[batch, length]`` token ids -> ``[batch, length - 1]`` log-probabilities (fp32) of tokens
1.. given the ones before them."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["smollm2"])
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--batches", nargs="+", type=at_least(1), default=[1, 8])
    p.add_argument(
        "--lengths", nargs="+", type=at_least(1), default=[128, 512], help="tokens per prompt"
    )
    p.add_argument("--repeats", type=at_least(1), default=5)
    p.add_argument(
        "--threads", type=at_least(1), default=None, help="default: torch's thread count"
    )
    p.add_argument("--hf-attn", default="sdpa", choices=["sdpa", "eager"],
                   help="transformers' attention implementation")  # fmt: skip
    p.add_argument("--start-timeout", type=above(0), default=600.0)


def make_ids(tokenizer: Any, batch: int, length: int) -> torch.Tensor:
    """``[batch, length]`` ids of different texts of random words (cut at ``length``)."""
    texts = make_texts(tokenizer, batch, length + 8)
    return torch.tensor([tokenizer(t)["input_ids"][:length] for t in texts])


def pace_scorer(path: Path, dtype: torch.dtype) -> Scorer:
    """``LLMModel.generate`` with ``prompt_logprobs`` (prefix caching off: every repeat scores
    the whole prompts)."""
    from pace_core import LLMModel, SamplingConfig

    llm = LLMModel(path, dtype=dtype, quiet=True, prefix_caching=False)
    config = SamplingConfig(max_new_tokens=1, prompt_logprobs=0, ignore_eos=True)

    def score(ids: torch.Tensor) -> torch.Tensor:
        out = llm.generate(ids, config)
        return torch.tensor([[e.logprob for e in s.prompt_logprobs[1:]] for s in out.sequences])

    return score


def served_scorer(url: str, client: httpx.Client) -> Scorer:
    """One ``/v1/completions`` request per call on ``client`` (kept across calls: making one
    costs ~30 ms): the batch's prompts, echoed and scored."""

    def score(ids: torch.Tensor) -> torch.Tensor:
        body = {"model": "bench", "prompt": ids.tolist(), "max_tokens": 0, "echo": True,
                "logprobs": 0, "temperature": 0}  # fmt: skip
        r = client.post(url + "/v1/completions", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"pace serve answered {r.status_code}: {r.text[:300]}")
        choices = sorted(r.json()["choices"], key=lambda c: c["index"])
        return torch.tensor([c["logprobs"]["token_logprobs"][1:] for c in choices])

    return score


def transformers_scorer(path: Path, attn: str) -> Scorer:
    """fp32 ``AutoModelForCausalLM``: one forward of the batch, ``log_softmax`` everywhere."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                                 attn_implementation=attn)  # fmt: skip
    model.eval()

    @torch.inference_mode()
    def score(ids: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=ids).logits[:, :-1].float()
        return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]

    return score


def load_engines(
    path: Path, args: argparse.Namespace, threads: int, stack: ExitStack
) -> dict[str, Scorer]:
    """engine -> scorer for one model, in ``--engines`` order (a started server is stopped when
    ``stack`` closes)."""
    engines: dict[str, Scorer] = {}
    for engine in args.engines:
        if engine == "pace-served":
            import httpx

            from pace_bench.serving_peers import EngineServer, pace_spec

            spec = pace_spec(path, dtype="bfloat16", threads=threads, max_running=64)
            server = EngineServer(spec)
            stack.callback(server.stop)
            server.wait_ready(args.start_timeout)
            client = stack.enter_context(httpx.Client(timeout=600.0))
            engines[engine] = served_scorer(server.url, client)
        elif engine.startswith("pace-"):
            dtype = torch.bfloat16 if engine == "pace-bf16" else torch.float32
            engines[engine] = pace_scorer(path, dtype)
        else:
            engines[engine] = transformers_scorer(path, args.hf_attn)
    return engines


def measure(
    engines: dict[str, Scorer], ids: torch.Tensor, repeats: int
) -> dict[str, dict[str, float | None]]:
    """Median seconds per call of every engine (round-robin) and the largest and mean absolute
    difference of its log-probabilities to transformers' (when transformers ran)."""
    times, scores = interleaved_results({name: partial(fn, ids) for name, fn in engines.items()},
                                        repeats)  # fmt: skip
    reference = scores.get("transformers")
    out: dict[str, dict[str, float | None]] = {}
    for name, t in times.items():
        got = scores[name]
        if got.shape != (ids.shape[0], ids.shape[1] - 1):
            raise RuntimeError(f"{name} scored {tuple(got.shape)} for prompts {tuple(ids.shape)}")
        diff = None if reference is None else (got.float() - reference).abs()
        out[name] = {
            "seconds": statistics.median(t),
            "max": None if diff is None else float(diff.max()),
            "mean": None if diff is None else float(diff.mean()),
        }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from pace_core.errors import ConfigError

    if min(args.lengths) < 2 or min(args.batches) < 1:
        raise ConfigError(
            f"--lengths must be >= 2 (a prompt's first token has no score) and --batches >= 1: "
            f"got --lengths {args.lengths} --batches {args.batches}"
        )
    saved = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    rows: list[dict[str, Any]] = []
    diffs: dict[str, dict[str, list[float]]] = {"max": {}, "mean": {}}
    try:
        for name in args.models:
            path = model_path(name)
            tok = AutoTokenizer.from_pretrained(str(path))
            with ExitStack() as stack:
                engines = load_engines(path, args, threads, stack)
                points = [(b, n) for n in args.lengths for b in args.batches]
                for batch, length in progress(points, f"scoring {name}", args.quiet):
                    ids = make_ids(tok, batch, length)
                    scored = batch * (ids.shape[1] - 1)
                    got = measure(engines, ids, args.repeats)
                    hf = got.get("transformers", {}).get("seconds")
                    for engine, m in got.items():
                        for kind in ("max", "mean"):
                            if m[kind] is not None:
                                diffs[kind].setdefault(engine, []).append(m[kind])
                        sec = m["seconds"]
                        rows.append({
                            "model": name, "batch": batch, "length": ids.shape[1],
                            "engine": engine, "tokens_s": round(scored / sec, 1),
                            "ms": round(sec * 1e3, 2),
                            "vs_hf": None if hf is None else round(hf / sec, 2),
                            "max_abs_diff": None if m["max"] is None else round(m["max"], 5),
                            "mean_abs_diff": None if m["mean"] is None else round(m["mean"], 5),
                        })  # fmt: skip
        note(args, f"scoring: {threads} thread(s)")
    finally:
        torch.set_num_threads(saved)
    payload = emit("scoring", rows, COLUMNS, args)
    summary = [
        ceiling_row(f"{engine} {kind} |logprob diff| vs transformers", diffs[kind][engine], limit)
        for kind, limits in (("max", MAX_DIFF), ("mean", MEAN_DIFF))
        for engine, limit in limits.items()
        if diffs[kind].get(engine)
    ]
    return with_targets(payload, summary, args.quiet)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench scoring [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("scoring", argv)
