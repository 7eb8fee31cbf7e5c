"""The ``families`` section of ``pace bench compile``: how much a compiled step could gain on
pace's own families, measured on real-shape models (``random:<shape>`` names or directories).

Per model and batch: pace's eager decode (``LLMModel``, the op plan it resolves: the fused
``decoder_stack`` where the plugin takes the blocks, the per-layer Python loop otherwise),
then the same weights with per-op profiling, which splits each decode step (one
``forward_step``: cache bookkeeping, rope tables, the layers, the head) into the time inside
kernels and the rest. The rest is everything compiling the step could remove (per-layer
Python, small torch ops between kernels, dispatch), so ``compile_bound = step / kernels`` is the
most a compiled step could gain over eager pace at this depth, and ``layer_bound`` (a layer's
kernels plus the step's whole outside time over its layers, over the layer's kernels; the LM
head timed alone and left out) the most at any depth. ``inductor`` is transformers' own
modeling code for the same weights under ``torch.compile(backend="inductor")`` (greedy over
its DynamicCache).

    pace bench compile --families random:qwen3-30b-a3b-2l random:moonlight-16b-a3b-2l \\
        random:llama4-scout-1l random:gemma4-text-6l --batches 1 --engines
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

import torch

from pace_bench.common import model_path, note, random_prompts, vocab_size

FAMILY_ENGINES = ("pace", "inductor")
COLUMNS = [
    "model", "engine", "batch", "layers", "stack", "decode_tok_s", "in_kernels",
    "kernel_us_per_layer", "outside_us_per_layer", "compile_bound", "layer_bound", "vs_pace",
]  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--families", nargs="*", default=[],
                   help="pace-family models (random:<shape> or a directory): the families "
                   "section")  # fmt: skip
    p.add_argument("--family-engines", nargs="+", default=list(FAMILY_ENGINES),
                   choices=FAMILY_ENGINES)  # fmt: skip


def _llm(path: Any, dtype: torch.dtype, args: argparse.Namespace, *, profile: bool) -> Any:
    from pace_core import LLMModel

    return LLMModel(path, dtype=dtype, load_tokenizer=False, opconfig=args.opconfig,
                    quiet=True, profile=profile)  # fmt: skip


def decode_steps(llm: Any, ids: torch.Tensor, steps: int) -> list[tuple[float, float]]:
    """Greedy decode steps after a prefill of ``ids``: (seconds, seconds inside kernels) per
    step (kernel time 0 without a profiler)."""
    from pace_core.models.decoder import forward_step

    model, prof = llm.model, llm.profiler
    cache = llm.new_cache(max_tokens=ids.shape[0] * (ids.shape[1] + steps + 8))
    seqs = cache.add_sequences(ids.shape[0])
    out = []
    with torch.inference_mode():
        logits = forward_step(model, cache, seqs, ids, [ids.shape[1]] * ids.shape[0])
        for _ in range(steps):
            token = logits.argmax(-1, keepdim=True)
            if prof is not None:
                prof.reset()
            start = time.perf_counter()
            logits = forward_step(model, cache, seqs, token, [1] * ids.shape[0])
            wall = time.perf_counter() - start
            out.append((wall, sum(prof.seconds.values()) if prof is not None else 0.0))
    return out


def head_seconds(llm: Any, batch: int, repeats: int = 5) -> float:
    """Median seconds of the LM head over ``batch`` rows (the step's largest kernel call)."""
    model = llm.model
    x = torch.randn(batch, 1, model.config.hidden_size).to(model.dtype)
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            start = time.perf_counter()
            model.head(x)
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _stack(llm: Any) -> str:
    found = [r.backend for r in llm.op_plan.resolutions if r.op == "decoder_stack"]
    return found[0] if found else "-"


def family_rows(args: argparse.Namespace, dtype: torch.dtype) -> list[dict[str, Any]]:
    """The families section's rows (see the module doc)."""
    rows: list[dict[str, Any]] = []
    steps = max(args.new_tokens, 4)
    for name in args.families:
        path = model_path(name)
        vocab = vocab_size(path)
        for batch in args.batches:
            ids = random_prompts(vocab, batch, args.prompt_len, torch.Generator().manual_seed(0))
            # both loaded, their runs alternated: load from other processes hits them alike
            eager, prof = (_llm(path, dtype, args, profile=p) for p in (False, True))
            layers, stack = eager.model.num_layers, _stack(eager)
            for llm in (eager, prof):
                decode_steps(llm, ids, 2)  # warm-up
            walls: list[float] = []
            timed: list[tuple[float, float]] = []
            for _ in range(args.repeats):
                walls += [w for w, _ in decode_steps(eager, ids, steps)]
                timed += decode_steps(prof, ids, steps)
            head = head_seconds(prof, batch)
            for llm in (eager, prof):
                llm.close()
            del eager, prof, llm
            gc.collect()
            step = statistics.median(walls)
            wall = statistics.median(w for w, _ in timed)
            kernels = statistics.median(k for _, k in timed)
            base = {"section": "families", "model": name, "batch": batch, "layers": layers}
            rows.append({**base, "engine": "pace", "stack": stack, "decode_tok_s": batch / step,
                         "vs_pace": 1.0})  # fmt: skip
            layer_kernels = max(kernels - head, 1e-9) / layers
            outside = (wall - kernels) / layers  # the step's bookkeeping counted as the layers'
            rows.append({
                **base, "engine": "pace-profiled", "stack": "per-op", "decode_tok_s": batch / wall,
                "in_kernels": kernels / wall, "kernel_us_per_layer": 1e6 * layer_kernels,
                "outside_us_per_layer": 1e6 * outside,
                "compile_bound": wall / kernels if kernels else None,
                "layer_bound": (layer_kernels + outside) / layer_kernels,
            })  # fmt: skip
            if "inductor" in args.family_engines:
                found = _inductor(path, dtype, ids, steps, args)
                found["vs_pace"] = found["decode_tok_s"] / (batch / step)
                rows.append({**base, **found})
        note(args, f"compile families: {name} done")
    return rows


def _inductor(
    path: Any, dtype: torch.dtype, ids: torch.Tensor, steps: int, args: argparse.Namespace
) -> dict[str, Any]:
    """transformers' code for ``path`` under inductor: decode tok/s (a row's fields)."""
    from transformers import AutoModelForCausalLM

    from pace_bench.compile import greedy

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    compiled = torch.compile(model, backend="inductor")
    greedy(compiled, ids, steps + 1)  # compiles (and recompiles for the growing cache)
    after = statistics.median(greedy(compiled, ids, steps + 1)[1] for _ in range(args.repeats))
    del model, compiled
    gc.collect()
    return {"engine": "inductor", "stack": "-", "decode_tok_s": ids.shape[0] * steps / after}
