"""Speculative decoding: prompt lookup on real models, and the cost of the machinery.

Three sections (``--sections``; a table each), all medians of interleaved repeats:

1. ``lookup``: greedy generation on input-grounded chat prompts (rename a
   variable in a ~150-token Python function, summarise a passage, extract fields) with
   n-gram prompt lookup vs plain decoding on the same engine, same run. Reports end-to-end
   tok/s and speedup, the decode-only speedup (time to first token, the same prefill for both,
   subtracted), acceptance, tokens per target forward and whether the outputs are identical
   (greedy speculation is exact up to the kernels' numerics; bf16 may flip near-ties).
2. ``verify``: target forward time over ``T`` new tokens (after a 256-token
   context) relative to ``T = 1``: what one verification of ``k = T - 1`` drafts costs.
3. ``mechanics``: random-weight target + draft pairs: unrelated drafts (nothing
   accepted: the pure cost of drafting + verifying), and a "bigram" pair whose blocks add
   nothing to the residual stream, so a 1-layer draft predicts the 12-layer target exactly
   (classic draft: 100% acceptance; PARD: only the first draft, as its masks carry no
   information): the best case of the machinery.

    pace bench speculative --models smollm2 gemma3-270m
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from pace_bench.common import emit, model_path, note, progress
from pace_core.arg_types import at_least

CODE = '''def summarize_orders(orders, tax_rate=0.08):
    """Return per-customer totals and the grand total of a list of orders."""
    totals = {}
    grand = 0.0
    for order in orders:
        customer = order["customer"]
        subtotal = 0.0
        for item in order["items"]:
            price = item["price"] * item["quantity"]
            if item.get("discount"):
                price = price * (1 - item["discount"])
            subtotal += price
        subtotal = subtotal * (1 + tax_rate)
        totals[customer] = totals.get(customer, 0.0) + subtotal
        grand += subtotal
    return totals, grand
'''

PASSAGE = (
    "The Rhine is one of the major rivers of Europe. It rises in the Swiss Alps, forms part of "
    "the border between Switzerland and Germany and between France and Germany, and flows "
    "north through the Rhineland before reaching the North Sea in the Netherlands. Its total "
    "length is about 1,230 kilometres. Since Roman times the river has been an important "
    "trade route: barges carry coal, grain, chemicals and containers between the port of "
    "Rotterdam and industrial cities such as Duisburg, Cologne and Basel. The Rhine valley is "
    "also known for its vineyards and castles, and the stretch between Bingen and Koblenz is "
    "a UNESCO World Heritage Site. In the twentieth century industrial pollution badly "
    "damaged the river, but a long clean-up programme that began in the 1980s brought salmon "
    "back to parts of it."
)

RECORDS = (
    "Meeting notes, 14 March. Present: Dana Whitfield (dana.whitfield@example.com, finance), "
    "Marco Ruiz (m.ruiz@example.org, logistics) and Priya Natarajan (priya.n@example.net, "
    "engineering). Dana will send the revised budget by 21 March. Marco confirmed the "
    "warehouse lease ends on 30 June. Priya asked for two more test servers before the April "
    "release."
)

TASKS: dict[str, str] = {  # chat prompts (instruct models)
    "code_rename": (
        "Rename the variable `subtotal` to `order_total` in this Python function. Reply with "
        f"the full updated function only.\n\n```python\n{CODE}```"
    ),
    "summarise": f"Summarise the following passage in three sentences.\n\n{PASSAGE}",
    "extract": (
        "List every person in these notes with their email address and department, one per "
        f"line as `name | email | department`.\n\n{RECORDS}"
    ),
}

COMPLETIONS: dict[str, str] = {  # the same tasks as text to continue (base models)
    "code_rename": (
        f"Original function:\n```python\n{CODE}```\n\nThe same function with the variable "
        "`subtotal` renamed to `order_total`:\n```python\n"
    ),
    "summarise": f"Passage:\n{PASSAGE}\n\nSummary of the passage in three sentences:\n",
    "extract": f"Notes:\n{RECORDS}\n\nPeople in the notes (name | email | department):\n",
}


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _timed(fn, *args: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def bench_prompt_lookup(args, dtype: torch.dtype) -> list[dict[str, Any]]:
    from pace_core import LLMModel, SamplingConfig
    from pace_core.speculative import PromptLookupConfig

    rows = []
    look = PromptLookupConfig(num_speculative_tokens=args.k, max_ngram=args.max_ngram)
    for name in args.models:
        path = model_path(name)
        plain = LLMModel(path, dtype=dtype, quiet=True)
        spec = LLMModel(path, dtype=dtype, quiet=True, spec_config=look)
        cfg = SamplingConfig(max_new_tokens=args.new_tokens)
        first = SamplingConfig(max_new_tokens=1)
        chat = bool(getattr(plain.tokenizer, "chat_template", None))
        for task, text in TASKS.items():
            msgs: Any = [{"role": "user", "content": text}] if chat else COMPLETIONS[task]
            times: dict[str, list[float]] = {"plain": [], "spec": [], "ttft": []}
            outs: dict[str, Any] = {}
            for rep in range(args.repeats + 1):  # interleaved; the first round is warm-up
                for label, model in (("plain", plain), ("spec", spec)):
                    dt, outs[label] = _timed(model.generate, msgs, cfg)
                    if rep:
                        times[label].append(dt)
                if rep:  # prefill + first token: the same computation in both engines
                    times["ttft"].append(_timed(plain.generate, msgs, first)[0])
            n_plain = len(outs["plain"].sequences[0].token_ids)
            n_spec = len(outs["spec"].sequences[0].token_ids)
            st = outs["spec"].spec_stats
            t_plain, t_spec = _median(times["plain"]), _median(times["spec"])
            ttft = _median(times["ttft"])
            dec_plain = (n_plain - 1) / max(t_plain - ttft, 1e-9)
            dec_spec = (n_spec - 1) / max(t_spec - ttft, 1e-9)
            rows.append(
                {
                    "model": name,
                    "task": task if chat else f"{task} (base)",
                    "prompt_tokens": len(outs["plain"].sequences[0].prompt_token_ids),
                    "new_tokens": n_spec,
                    "plain_tok_s": n_plain / t_plain,
                    "spec_tok_s": n_spec / t_spec,
                    "speedup": (n_spec / t_spec) / (n_plain / t_plain),
                    "ttft_s": ttft,
                    "plain_decode_tok_s": dec_plain,
                    "spec_decode_tok_s": dec_spec,
                    "decode_speedup": dec_spec / dec_plain,
                    "acceptance": st.acceptance_rate,
                    "tokens_per_step": st.tokens_per_step,
                    "identical": outs["plain"].generated_token_ids
                    == outs["spec"].generated_token_ids,
                    "plain_s": t_plain,
                    "spec_s": t_spec,
                    "accept_per_pos": [round(x, 2) for x in st.acceptance_rate_per_position],
                }
            )
    return rows


def bench_verify_cost(args, dtype: torch.dtype) -> list[dict[str, Any]]:
    from pace_core import LLMModel

    rows = []
    for name in args.models:
        path = model_path(name)
        llm = LLMModel(path, dtype=dtype, quiet=True, load_tokenizer=False)
        inf = llm.inferencer
        gen = torch.Generator().manual_seed(0)
        ctx = torch.randint(100, 5000, (256,), generator=gen)
        kv = inf.new_kv(1)
        inf.forward([ctx], kv, all_logits=False)
        base = None
        for t in (1, 2, 5, 9, 13):
            ids = torch.randint(100, 5000, (1, t), generator=gen)
            samples = []
            for _ in range(args.repeats + 2):
                dt, _ = _timed(inf.forward, ids, kv)
                kv.crop(t)
                samples.append(dt)
            med = _median(samples[1:])
            base = base or med
            rows.append({"model": name, "T": t, "forward_ms": med * 1e3, "vs_T1": med / base})
        kv.release()
    return rows


def _share(runs: list[tuple[float, Any]], attr: str) -> float | None:
    """Median over runs of a stats time field as a fraction of that run's wall time."""
    if runs[0][1] is None:
        return None
    return _median([getattr(st, attr) / dt for dt, st in runs])


def _random_llama(
    path: Path, vocab: int, hidden: int, layers: int, seed: int, like: Path | None = None, **extra
) -> Path:
    """A random Llama. ``like``: a *bigram* model sharing ``like``'s embeddings, final norm and
    LM head, with every block's output projections zeroed (its logits depend on the current
    token only, so any two such models with the same ``like`` agree; compute is unchanged)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 192),
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        **extra,
    )
    model = LlamaForCausalLM(cfg)
    if like is not None:
        src = LlamaForCausalLM.from_pretrained(str(like))
        with torch.no_grad():
            model.model.embed_tokens.weight[: src.config.vocab_size] = src.model.embed_tokens.weight
            model.lm_head.weight.zero_()
            model.lm_head.weight[: src.config.vocab_size] = src.lm_head.weight
            model.model.norm.weight.copy_(src.model.norm.weight)
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(path)
    return path


def bench_mechanics(args, dtype: torch.dtype) -> list[dict[str, Any]]:
    from pace_core import LLMModel, SamplingConfig
    from pace_core.speculative import DraftSpecDecodeConfig, PardSpecDecodeConfig

    tmp = Path(tempfile.mkdtemp(prefix="pace-spec-bench-"))
    vocab, hidden = 8192, 576
    target = _random_llama(tmp / "target", vocab, hidden, 12, 0)
    draft = _random_llama(tmp / "draft", vocab, 192, 2, 1)
    pard = _random_llama(tmp / "pard", vocab + 1, 192, 2, 2, pard_token=vocab)
    bigram = _random_llama(tmp / "bigram", vocab, hidden, 12, 3, like=target)
    b_draft = _random_llama(tmp / "bigram_d", vocab, hidden, 1, 4, like=bigram)
    b_pard = _random_llama(tmp / "bigram_p", vocab + 1, hidden, 1, 5, like=bigram, pard_token=vocab)
    setups: dict[str, tuple[Path, Any]] = {
        "plain": (target, None),
        "draft k=4 (random)": (target, DraftSpecDecodeConfig(draft, num_speculative_tokens=4)),
        "pard k=8 (random)": (target, PardSpecDecodeConfig(pard, num_speculative_tokens=8)),
        "plain (bigram target)": (bigram, None),
        "draft k=4 (bigram pair)": (
            bigram,
            DraftSpecDecodeConfig(b_draft, num_speculative_tokens=4),
        ),
        "pard k=4 (bigram pair)": (bigram, PardSpecDecodeConfig(b_pard, num_speculative_tokens=4)),
    }
    models = {
        label: LLMModel(path, dtype=dtype, quiet=True, load_tokenizer=False, spec_config=sc)
        for label, (path, sc) in setups.items()
    }
    gen = torch.Generator().manual_seed(0)
    rows = []
    for batch in args.batches:
        ids = torch.randint(0, vocab, (batch, 64), generator=gen)
        cfg = SamplingConfig(max_new_tokens=args.mech_tokens, ignore_eos=True)
        runs: dict[str, list[tuple[float, Any]]] = {label: [] for label in models}
        for rep in range(args.repeats + 1):
            for label, model in models.items():
                dt, out = _timed(model.generate, ids, cfg)
                if rep:
                    runs[label].append((dt, out.spec_stats))
        for label in models:
            t = _median([dt for dt, _ in runs[label]])
            base = "plain (bigram target)" if "bigram" in label else "plain"
            st = runs[label][-1][1]

            rows.append(
                {
                    "setup": label,
                    "batch": batch,
                    "tok_s": batch * args.mech_tokens / t,
                    "vs_plain": _median([dt for dt, _ in runs[base]]) / t,
                    "acceptance": None if st is None else st.acceptance_rate,
                    "tokens_per_step": None if st is None else st.tokens_per_step,
                    "draft_share": _share(runs[label], "draft_seconds"),
                    "verify_share": _share(runs[label], "verify_seconds"),
                }
            )
    return rows


SECTIONS: dict[str, tuple[Any, list[str]]] = {  # name -> (rows(args, dtype), table columns)
    "lookup": (
        bench_prompt_lookup,
        [
            "model",
            "task",
            "prompt_tokens",
            "new_tokens",
            "plain_tok_s",
            "spec_tok_s",
            "speedup",
            "decode_speedup",
            "acceptance",
            "tokens_per_step",
            "identical",
        ],
    ),
    "verify": (bench_verify_cost, ["model", "T", "forward_ms", "vs_T1"]),
    "mechanics": (
        bench_mechanics,
        [
            "setup",
            "batch",
            "tok_s",
            "vs_plain",
            "acceptance",
            "tokens_per_step",
            "draft_share",
            "verify_share",
        ],
    ),
}
QUICK = {"new_tokens": 32, "repeats": 1, "sections": ["lookup", "verify"]}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["smollm2"])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--k", type=at_least(1), default=8, help="prompt lookup num_speculative_tokens")
    p.add_argument("--max-ngram", type=at_least(1), default=3)
    p.add_argument("--new-tokens", type=at_least(1), default=128)
    p.add_argument("--repeats", type=at_least(1), default=3)
    p.add_argument("--threads", type=at_least(1), default=None)
    p.add_argument(
        "--batches", nargs="+", type=at_least(1), default=[1, 4], help="mechanics batches"
    )
    p.add_argument("--mech-tokens", type=at_least(1), default=64)
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The chosen sections, rows tagged with their ``section``; returns the JSON payload."""
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    note(args, f"speculative: threads={torch.get_num_threads()} load_average={os.getloadavg()}")
    rows = []
    for section in progress(args.sections, "speculative", args.quiet):
        rows += [{"section": section, **r} for r in SECTIONS[section][0](args, dtype)]
    note(args, f"speculative: load_average_after={os.getloadavg()}")
    columns = {name: cols for name, (_, cols) in SECTIONS.items()}
    return emit("speculative", rows, columns, args)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench speculative [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("speculative", argv)
