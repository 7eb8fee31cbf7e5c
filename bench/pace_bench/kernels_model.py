"""The ``model`` section of ``pace bench kernels``: prefill and decode of a whole model under
one plan per installed backend (every op it has, native for the rest), plus ``auto``."""

from __future__ import annotations

import statistics
from functools import partial
from typing import Any

import torch

from pace_bench.common import (
    dtype_name,
    interleaved,
    keep_backend,
    model_path,
    random_prompts,
    vocab_size,
)
from pace_core.ops import OPS
from pace_core.plugins import get_host
from pace_core.registry import backends


def backend_plans(names: list[str] | None) -> dict[str, dict[str, Any]]:
    """``native``, one plan per other installed backend (every op it has), and ``auto``."""
    ops = get_host().ops
    plans: dict[str, dict[str, Any]] = {"native": {"default": "native"}}
    for backend in backends(ops):
        if backend != "native":
            mine = [op for op in OPS if backend in backends(ops, op)]
            plans[backend] = {**dict.fromkeys(mine, backend), "default": "native"}
    plans["auto"] = {"default": "auto"}
    return {name: plan for name, plan in plans.items() if keep_backend(names, name)}


def bench_model(args, dtype: torch.dtype, threads: int, rows: list) -> None:
    """Prefill and decode of a whole model, one row pair per backend plan."""
    from pace_core import LLMModel, SamplingConfig

    path, n = model_path(args.model), args.model_tokens
    plans = backend_plans(args.backends)
    models = {
        name: LLMModel(path, dtype=dtype, opconfig=plan, quiet=True, load_tokenizer=False)
        for name, plan in plans.items()
    }
    gen = torch.Generator().manual_seed(0)
    ids = random_prompts(vocab_size(path), 1, args.model_prompt, gen)
    steps = {k: SamplingConfig(max_new_tokens=k, min_new_tokens=k) for k in (1, n + 1)}
    fns = {
        (name, k): partial(model.generate, ids, cfg)
        for name, model in models.items()
        for k, cfg in steps.items()
    }
    med = {
        key: statistics.median(t)
        for key, t in interleaved(fns, args.repeats, args.clock_fn).items()
    }
    base_prefill = med.get(("native", 1))
    base_decode = None if base_prefill is None else n / (med[("native", n + 1)] - base_prefill)
    for name, model in models.items():
        prefill = med[(name, 1)]
        decode = n / (med[(name, n + 1)] - prefill)
        uses = ",".join(sorted({b for bs in model.op_plan.backends().values() for b in bs}))
        fields = {
            "dtype": dtype_name(dtype),
            "shape": str(args.model),
            "threads": threads,
            "backend": name,
            "uses": uses,
        }
        rows.append(
            {
                **fields,
                "section": "model-prefill",
                "M": args.model_prompt,
                "value": prefill * 1e3,
                "unit": "ms",
                "vs_native": base_prefill / prefill if base_prefill else None,
            }
        )
        rows.append(
            {
                **fields,
                "section": "model-decode",
                "M": 1,
                "value": decode,
                "unit": "tok/s",
                "vs_native": decode / base_decode if base_decode else None,
            }
        )
