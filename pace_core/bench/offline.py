"""Offline generation: pace (native kernels) vs transformers, side by side in one run.

Measures TTFT (prefill of a 128-token prompt + first token), decode tok/s and total tok/s
for batch 1 and 8 at 1 and 2 threads; reports medians and the pace/transformers ratio.

    python benchmarks/offline.py --models smollm2 gemma3-270m --dtype bfloat16
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from pace_core.bench.common import emit, median_time


def run_pace(model, ids, new_tokens):
    from pace_core import SamplingConfig

    cfg = SamplingConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    return lambda: model.generate(ids, cfg)


def run_hf(model, ids, new_tokens):
    def go():
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


def measure(engine, model, ids, new_tokens, repeats):
    make = run_pace if engine == "pace" else run_hf
    ttft = median_time(make(model, ids, 1), repeats)
    total = median_time(make(model, ids, new_tokens), repeats)
    b = ids.shape[0]
    decode = b * (new_tokens - 1) / max(total - ttft, 1e-9)
    return {"ttft_s": ttft, "decode_tok_s": decode, "total_tok_s": b * new_tokens / total}


def main() -> None:
    from transformers import AutoModelForCausalLM

    from pace_core import LLMModel, zoo

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--models", nargs="+", default=["smollm2"])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="directory for the JSON result")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for name in args.models:
        path = zoo.pull(name, quiet=True) if zoo.is_zoo_name(name) else Path(name)
        engines = {
            "pace": LLMModel(path, dtype=dtype),
            "transformers": AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval(),
        }
        gen = torch.Generator().manual_seed(0)
        for threads in args.threads:
            torch.set_num_threads(threads)
            for batch in args.batches:
                ids = torch.randint(100, 5000, (batch, args.prompt_len), generator=gen)
                res = {
                    e: measure(e, m, ids, args.new_tokens, args.repeats) for e, m in engines.items()
                }
                for engine, r in res.items():
                    rows.append(
                        {
                            "model": name,
                            "engine": engine,
                            "threads": threads,
                            "batch": batch,
                            **r,
                            "decode_vs_hf": r["decode_tok_s"] / res["transformers"]["decode_tok_s"],
                        }
                    )
    emit(
        "offline",
        rows,
        [
            "model",
            "engine",
            "threads",
            "batch",
            "ttft_s",
            "decode_tok_s",
            "total_tok_s",
            "decode_vs_hf",
        ],
        args.out,
    )


if __name__ == "__main__":
    main()
