"""Graph compilation: transformers' own modeling code run eager, compiled by inductor and
compiled by the pace backend, on architectures pace has no family for, one run.

Each model is built from its real config shapes with random weights (``--layers`` overrides
the depth; full depth by default), in ``--dtype``. The three engines share the weights:
``transformers`` calls the model, ``inductor`` and ``pace`` are ``torch.compile`` of it
(``backend="inductor"`` and a :class:`pace_core.compile.PaceBackend`). A generation is a
greedy loop over transformers' ``DynamicCache`` (prompt of ``--prompt-len`` random tokens,
``--new-tokens`` tokens); every engine first generates once untimed (compilation, including
the recompile for a growing cache), then the engines are timed round-robin and the medians
give decode tok/s (tokens after the first over the time after it) and prefill tok/s.
``pace-llm`` is what a user gets from ``LLMModel(path)`` on such a model: the same weights
saved once under ``~/.cache/pace/random``, loaded through pace's fallback (transformers' code
compiled with the pace backend, attending over pace's paged cache, driven by the engine core);
its rates come from timing ``generate`` for 1 and for ``--new-tokens`` tokens.

    pace bench compile --models olmo2-1b pythia-1b --batches 1 8
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from pace_bench import compile_families
from pace_bench.common import emit, note, progress, target_row, with_targets
from pace_core.arg_types import at_least

ENGINES = ("transformers", "inductor", "pace", "pace-llm")
# name -> (transformers model_type, config kwargs): real shapes of public checkpoints
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    # allenai/OLMo-2-0425-1B
    "olmo2-1b": ("olmo2", dict(
        vocab_size=100352, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096,
        rms_norm_eps=1e-6, tie_word_embeddings=False)),
    # EleutherAI/pythia-1b
    "pythia-1b": ("gpt_neox", dict(
        vocab_size=50304, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=8, rotary_pct=0.25, max_position_embeddings=2048,
        use_parallel_residual=True, tie_word_embeddings=False)),
    # ibm-granite/granite-3.1-2b-base (Llama-like with residual/attention/logit multipliers)
    "granite-2b": ("granite", dict(
        vocab_size=49155, hidden_size=2048, intermediate_size=8192, num_hidden_layers=40,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096,
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015625,
        logits_scaling=8.0, tie_word_embeddings=True)),
}  # fmt: skip
COLUMNS = {
    "no-family": [
        "model", "engine", "batch", "layers", "prefill_tok_s", "decode_tok_s", "decode_vs_hf",
        "decode_vs_inductor", "compile_s",
    ],
    "families": compile_families.COLUMNS,
}  # fmt: skip
QUICK = {"models": ["olmo2-1b"], "layers": 2, "batches": [1], "new_tokens": 8, "repeats": 2}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--models",
        nargs="*",
        default=["olmo2-1b", "pythia-1b"],
        choices=list(MODELS),
        help="no-family architectures (none: skip them)",
    )
    compile_families.add_arguments(p)  # fmt: skip
    p.add_argument("--layers", type=at_least(1), default=None, help="depth (default: the real one)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--opconfig", default=None, help="the pace backend's OperatorConfig")
    p.add_argument("--batches", nargs="+", type=at_least(1), default=[1, 8])
    p.add_argument("--prompt-len", type=at_least(1), default=64)
    p.add_argument("--new-tokens", type=at_least(1), default=32)
    p.add_argument("--repeats", type=at_least(1), default=3)
    p.add_argument("--threads", type=at_least(1), default=None, help="default: torch's")


def build_model(name: str, layers: int | None, dtype: torch.dtype) -> torch.nn.Module:
    """``name``'s architecture and shapes with N(0, 0.02) weights (seed 0)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, kwargs = MODELS[name]
    if layers is not None:
        kwargs = {**kwargs, "num_hidden_layers": layers}
    config = AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def greedy(model: Callable[..., Any], ids: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """Greedy generation over a DynamicCache: (seconds to the first token, seconds after)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    start = time.perf_counter()
    with torch.inference_mode():
        ids = ids.clone()  # an inference tensor, like every token after it (one graph key)
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
        token = logits[:, -1:].argmax(-1)
        first = time.perf_counter()
        for _ in range(new_tokens - 1):
            logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits
            token = logits[:, -1:].argmax(-1)
    return first - start, time.perf_counter() - first


def engines(
    name: str, model: torch.nn.Module, args: argparse.Namespace
) -> dict[str, Callable[[torch.Tensor, int], tuple[float, float]]]:
    """engine -> ``run(ids, new_tokens)`` returning (seconds to the first token, after)."""
    from pace_core.compile import PaceBackend

    out: dict[str, Callable[[torch.Tensor, int], tuple[float, float]]] = {}
    for engine in args.engines:
        if engine == "transformers":
            out[engine] = functools.partial(greedy, model)
        elif engine == "inductor":
            out[engine] = functools.partial(greedy, torch.compile(model, backend="inductor"))
        elif engine == "pace":
            compiled = torch.compile(model, backend=PaceBackend(args.opconfig))
            out[engine] = functools.partial(greedy, compiled)
        else:
            out[engine] = functools.partial(llm_greedy, pace_llm(name, model, args))
    return out


def pace_llm(name: str, model: torch.nn.Module, args: argparse.Namespace) -> Any:
    """``LLMModel`` on ``model``'s weights, saved once under the pace cache."""
    from pace_core import LLMModel
    from pace_core.paths import cache_root

    layers = model.config.num_hidden_layers
    path = cache_root() / "random" / f"compile-{name}-{layers}l-{args.dtype}"
    if not (path / "config.json").exists():
        model.save_pretrained(path)
    # prefix caching off: the timed prompts repeat
    return LLMModel(path, dtype=model.dtype, load_tokenizer=False, opconfig=args.opconfig,
                    quiet=True, prefix_caching=False)  # fmt: skip


def llm_greedy(llm: Any, ids: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """``generate`` timed for one token and for ``new_tokens``: (first, after)."""
    from pace_core.sampling.config import SamplingConfig

    prompts = list(ids)
    start = time.perf_counter()
    llm.generate(prompts, SamplingConfig(max_new_tokens=1, ignore_eos=True))
    first = time.perf_counter() - start
    start = time.perf_counter()
    llm.generate(prompts, SamplingConfig(max_new_tokens=new_tokens, ignore_eos=True))
    return first, time.perf_counter() - start - first


def run(args: argparse.Namespace) -> dict[str, Any]:
    # inductor and pace compile the same transformers code (the recompile limit counts both)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    rows: list[dict[str, Any]] = []
    for name in args.models:
        model = build_model(name, args.layers, dtype)
        layers = model.config.num_hidden_layers
        fns = engines(name, model, args)
        gen = torch.Generator().manual_seed(0)
        for batch in progress(args.batches, f"compile {name}", args.quiet):
            ids = torch.randint(0, model.config.vocab_size, (batch, args.prompt_len), generator=gen)
            compile_s = {}
            for engine, fn in fns.items():  # untimed: compiles (and recompiles) happen here
                start = time.perf_counter()
                fn(ids, args.new_tokens)
                compile_s[engine] = time.perf_counter() - start
            timed: dict[str, list[tuple[float, float]]] = {e: [] for e in fns}
            for _ in range(args.repeats):
                for engine, fn in fns.items():
                    timed[engine].append(fn(ids, args.new_tokens))
            for engine, runs in timed.items():
                first = statistics.median(r[0] for r in runs)
                after = statistics.median(r[1] for r in runs)
                rows.append({
                    "section": "no-family", "model": name, "engine": engine, "batch": batch,
                    "layers": layers,
                    "prefill_tok_s": batch * args.prompt_len / first,
                    "decode_tok_s": batch * (args.new_tokens - 1) / after,
                    "compile_s": compile_s[engine],
                })  # fmt: skip
        del fns, model
    _ratios(rows)
    rows += compile_families.family_rows(args, dtype)
    payload = emit("compile", rows, COLUMNS, args)
    summary = []
    for ref, key, target in (("transformers", "decode_vs_hf", 2.0),
                             ("inductor", "decode_vs_inductor", 1.2)):  # fmt: skip
        values = [r[key] for r in rows if r["engine"] == "pace" and r.get(key) is not None]
        if values:
            summary.append(target_row(f"pace decode / {ref} decode", values, target))
    values = [r["decode_vs_hf"] for r in rows if r["engine"] == "pace-llm" and r["decode_vs_hf"]]
    if values:
        summary.append(target_row("pace-llm decode / transformers decode", values, 2.0))
    bounds = [r["layer_bound"] for r in rows if r.get("layer_bound")]
    if bounds:  # the families' target: a compiled step >= 1.2x eager pace
        summary.append(target_row("families: layer / its kernels (compile's bound)", bounds,
                                  1.2))  # fmt: skip
    if not any(r["engine"] == "pace" for r in rows):
        note(args, "compile: pace not among --engines; no targets checked")
    return with_targets(payload, summary, args.quiet)


def _ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's decode rate over transformers' and inductor's at the same point."""
    by_point = {(r["model"], r["batch"], r["engine"]): r["decode_tok_s"] for r in rows}
    for r in rows:  # (the no-family section's rows: the families' come after)
        for ref, key in (("transformers", "decode_vs_hf"), ("inductor", "decode_vs_inductor")):
            base = by_point.get((r["model"], r["batch"], ref))
            r[key] = None if base is None else r["decode_tok_s"] / base


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench compile [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("compile", argv)
