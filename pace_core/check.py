"""``pace check``: compare pace against transformers on a model before trusting it.

For each dtype and backend plan (``native`` everywhere, and ``auto``), generate greedily over a
fixed prompt set with both engines and compare: fp32 must give identical tokens; bf16 tokens
must be near-ties under the fp32 transformers reference (the top-k-logprob rule). Also reports
the largest fp32 logit difference on the prompts. A GGUF file is compared with transformers
running the same file de-quantized.

With ``quantization`` (pace's quantize-on-load), token equality is not expected: each plan and
dtype is held to a mean KL divergence and a top-1 agreement against the fp32 transformers
model over the first windows of ``pace_core.quality.TEXT`` (:data:`QUALITY_LIMITS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pace_core.models import gguf_source
from pace_core.quant import coerce_quantization

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
    ran_on: str = ""  # the backends the plan's ops ran on (a pinned one may fall back)


def near_tie(ref_logits: torch.Tensor, token: int, k: int = 5, tol: float = 0.5) -> bool:
    """``token`` is within the reference's top-k and ``tol`` nats of its best logprob."""
    lp = torch.log_softmax(ref_logits.float(), dim=-1)
    top = lp.topk(k)
    return token in top.indices.tolist() and float(top.values[0] - lp[token]) <= tol


# (max mean KLD, min top-1 agreement) per bits, against the fp32 reference, bf16 compute
QUALITY_LIMITS = {8: (0.02, 0.93), 4: (0.15, 0.80)}
QUALITY_TOKENS, QUALITY_WINDOW = 1024, 256


def reference_model(path: Path) -> Any:
    """transformers' fp32 model of a directory or GGUF file (de-quantized by transformers)."""
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if path.suffix == gguf_source.SUFFIX:
        path, kwargs["gguf_file"] = path.parent, path.name
    return AutoModelForCausalLM.from_pretrained(str(path), **kwargs).eval()


def check_plans(plans: Sequence[str]) -> dict[str, str]:
    """Each plan (a backend for every op, or an OperatorConfig string) -> its OperatorConfig
    string, checked (a ConfigError names a bad op or backend)."""
    from pace_core.opconfig import OperatorConfig
    from pace_core.plugins import get_host

    out = {}
    for plan in plans:
        given = "=" in plan or plan.lstrip().startswith("{")  # op=backend pairs or JSON
        text = plan if given else f"default={plan}"
        get_host().resolver(OperatorConfig.coerce(text))
        out[plan] = text
    return out


def check_quantized(
    path: str, quantization: Any, plans: Sequence[str] = ("native", "auto")
) -> list[CheckRow]:
    """Quality of pace's quantize-on-load against transformers' fp32 model."""
    from pace_core.engine.llm import LLMModel
    from pace_core.models.loader import load_tokenizer
    from pace_core.quality import compare, text_ids, windows

    q = coerce_quantization(quantization)
    max_kld, min_top1 = QUALITY_LIMITS[q.bits]
    hf = reference_model(Path(path))
    ids = text_ids(load_tokenizer(Path(path)))[:QUALITY_TOKENS]
    chunks = windows(ids, QUALITY_WINDOW)
    rows = []
    for plan, opconfig in check_plans(plans).items():
        for dtype in (torch.float32, torch.bfloat16):
            model = LLMModel(path, dtype=dtype, opconfig=opconfig, quiet=True,
                             quantization=q)  # fmt: skip
            r = compare(lambda x: hf(x).logits, model.logits, chunks)
            passed = r.kld_mean <= max_kld and r.top1 >= min_top1
            rows.append(
                CheckRow(plan, f"{str(dtype)[6:]} {q.name}", len(chunks), r.tokens, 0, None,
                         passed, f"KLD {r.kld_mean:.4f} (<= {max_kld}), top-1 {r.top1:.1%} "
                         f"(>= {min_top1:.0%}), ppl {r.ppl:.2f} vs {r.ppl_reference:.2f}")
            )  # fmt: skip
    return rows


def run_check(
    path: str,
    *,
    new_tokens: int = 24,
    prompts: Sequence[str] = PROMPTS,
    plans: Sequence[str] = ("native", "auto"),
) -> list[CheckRow]:
    from pace_core.engine.llm import LLMModel
    from pace_core.models.loader import load_config, load_tokenizer
    from pace_core.sampling.config import SamplingConfig

    load_config(Path(path))  # a folder that is no model fails here, naming what it lacks
    tok = load_tokenizer(Path(path))
    hf = reference_model(Path(path))
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
    for plan, opconfig in check_plans(plans).items():
        for dtype in (torch.float32, torch.bfloat16):
            model = LLMModel(path, dtype=dtype, opconfig=opconfig, quiet=True)
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
                    ", ".join(sorted({r.backend for r in model.op_plan.resolutions})),
                )
            )
    return rows


COLUMNS = ["plan", "ran on", "dtype", "prompts", "tokens", "mismatches", "max |Δlogit|",
           "result", "rule"]  # fmt: skip


def format_rows(rows: Sequence[CheckRow]) -> str:
    from pace_core.report import format_table

    return format_table(
        COLUMNS,
        [
            [
                r.plan,
                r.ran_on,
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
