"""``pace check``: compare pace against transformers on a model before trusting it.

For each dtype and backend plan (``native`` everywhere, and ``auto``), generate greedily over a
fixed prompt set with both engines and compare: fp32 must give identical tokens; bf16 tokens
must be near-ties under the fp32 transformers reference (the top-k-logprob rule). Also reports
the largest fp32 logit difference on the prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, there was a little",
    "List three colors:",
)


@dataclass
class CheckRow:
    plan: str
    dtype: str
    prompts: int
    tokens: int
    mismatches: int
    max_logit_diff: float | None
    passed: bool
    note: str = ""


def near_tie(ref_logits: torch.Tensor, token: int, k: int = 5, tol: float = 0.5) -> bool:
    """``token`` is within the reference's top-k and ``tol`` nats of its best logprob."""
    lp = torch.log_softmax(ref_logits.float(), dim=-1)
    top = lp.topk(k)
    return token in top.indices.tolist() and float(top.values[0] - lp[token]) <= tol


def run_check(
    path: str,
    *,
    new_tokens: int = 24,
    prompts: Sequence[str] = PROMPTS,
    plans: Sequence[str] = ("native", "auto"),
) -> list[CheckRow]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pace_core.engine.llm import LLMModel
    from pace_core.sampling.config import SamplingConfig

    tok = AutoTokenizer.from_pretrained(str(path))
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    cfg = SamplingConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    encoded = [torch.tensor(tok(p)["input_ids"]) for p in prompts]
    with torch.inference_mode():
        ref_tokens = [
            hf.generate(
                ids.view(1, -1),
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
            )[0, ids.numel() :].tolist()
            for ids in encoded
        ]
    rows = []
    for plan in plans:
        for dtype in (torch.float32, torch.bfloat16):
            model = LLMModel(path, dtype=dtype, opconfig=f"default={plan}", quiet=True)
            got = model.generate(encoded, cfg).generated_token_ids
            mismatches, max_diff = 0, None
            for ids, want, have in zip(encoded, ref_tokens, got):
                if dtype == torch.float32:
                    mismatches += sum(a != b for a, b in zip(want, have))
                    continue
                full = torch.cat([ids, torch.tensor(have)]).view(1, -1)
                with torch.inference_mode():
                    ref = hf(full).logits[0, ids.numel() - 1 : -1]
                mismatches += sum(not near_tie(ref[t], tok_id) for t, tok_id in enumerate(have))
            if dtype == torch.float32:
                with torch.inference_mode():
                    diffs = [
                        (hf(ids.view(1, -1)).logits[0] - model.logits(ids.view(1, -1))[0])
                        .abs()
                        .max()
                        for ids in encoded
                    ]
                max_diff = float(max(diffs))
            rows.append(
                CheckRow(
                    plan,
                    str(dtype).removeprefix("torch."),
                    len(prompts),
                    len(prompts) * new_tokens,
                    mismatches,
                    max_diff,
                    mismatches == 0,
                    "identical greedy tokens required"
                    if dtype == torch.float32
                    else "top-5 near-tie rule (0.5 nats)",
                )
            )
    return rows


def format_rows(rows: Sequence[CheckRow]) -> str:
    from pace_core.report import format_table

    return format_table(
        ["plan", "dtype", "prompts", "tokens", "mismatches", "max |Δlogit|", "result", "rule"],
        [
            [
                r.plan,
                r.dtype,
                str(r.prompts),
                str(r.tokens),
                str(r.mismatches),
                "-" if r.max_logit_diff is None else f"{r.max_logit_diff:.2e}",
                "PASS" if r.passed else "FAIL",
                r.note,
            ]
            for r in rows
        ],
    )
