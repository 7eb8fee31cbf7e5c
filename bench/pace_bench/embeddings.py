"""Embeddings: inputs/s and tokens/s of pace, transformers and llama.cpp on the same model.

Per model, batch size (``--batches``) and input length (``--lengths``, tokens), every engine
embeds the same texts (random English words, a different text per row) into one
L2-normalised vector each, pooled the same way (``--pooling``: the last token's state, pace's
default for a decoder LM, or the mean), timed round-robin
(:func:`~pace_bench.common.interleaved_results`), medians:

- ``pace-bf16``, ``pace-fp32``: ``LLMModel.embed`` (through the engine core);
- ``transformers``: fp32 ``AutoModel`` run eagerly (no compile; ``--hf-attn`` sdpa by
  default) on a right-padded batch, its ``last_hidden_state`` pooled over the attention mask;
- ``llama.cpp-bf16``, ``llama.cpp-fp32``: llama-cpp-python's embedding mode
  (``Llama(embedding=True)``, its pooling set to the same mode, ``.embed(texts,
  normalize=True)``) on a BF16 / F32 GGUF converted from the same checkpoint (``make
  bench-peers``); skipped with the reason when it is not installed.

Each row also reports the engine's worst cosine to transformers' vectors of the same texts
(a correctness check: fp32 engines should be ~1.0). Targets: pace fp32 cosine >= 0.999 (the
issue's bar), pace bf16 >= 0.99.

    pace bench embeddings --batches 1 8 32 --lengths 16 128 512 --engines pace-bf16 llama.cpp-bf16
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from pace_bench.common import (
    emit,
    interleaved_results,
    make_texts,
    model_path,
    note,
    progress,
    target_row,
    with_targets,
)
from pace_core.arg_types import at_least

ENGINES = ("pace-bf16", "pace-fp32", "transformers", "llama.cpp-bf16", "llama.cpp-fp32")
COLUMNS = ["model", "batch", "length", "engine", "inputs_s", "tokens_s", "ms", "vs_hf",
           "cosine_vs_hf"]  # fmt: skip
QUICK = {"batches": [1, 8], "lengths": [32], "repeats": 2}
TARGETS = {"pace-fp32": 0.999, "pace-bf16": 0.99}  # minimum cosine to transformers
Embedder = Callable[[list[str]], torch.Tensor]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["smollm2"])
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--batches", nargs="+", type=at_least(1), default=[1, 8, 32])
    p.add_argument("--lengths", nargs="+", type=at_least(1), default=[16, 128, 512],
                   help="tokens per input")  # fmt: skip
    p.add_argument("--pooling", default="last", choices=["last", "mean"])
    p.add_argument("--repeats", type=at_least(1), default=5)
    p.add_argument(
        "--threads", type=at_least(1), default=None, help="default: torch's thread count"
    )
    p.add_argument("--hf-attn", default="sdpa", choices=["sdpa", "eager"],
                   help="transformers' attention implementation")  # fmt: skip


def pace_embedder(path: Path, dtype: torch.dtype, pooling: str) -> Embedder:
    """``LLMModel.embed`` (prefix caching off: every repeat embeds the same texts)."""
    from pace_core import LLMModel

    llm = LLMModel(path, dtype=dtype, quiet=True, prefix_caching=False)
    return lambda texts: llm.embed(texts, pooling=pooling, normalize=True)


def transformers_embedder(path: Path, pooling: str, attn: str) -> Embedder:
    """fp32 ``AutoModel`` on a right-padded batch, pooled over the attention mask."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModel.from_pretrained(str(path), dtype=torch.float32, attn_implementation=attn)
    model.eval()

    @torch.inference_mode()
    def embed(texts: list[str]) -> torch.Tensor:
        enc = tok(texts, padding=True, padding_side="right", return_tensors="pt")
        states = model(**enc).last_hidden_state
        mask = enc["attention_mask"]
        if pooling == "last":
            pooled = states[torch.arange(len(texts)), mask.sum(1) - 1]
        else:
            pooled = (states * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return torch.nn.functional.normalize(pooled.float(), dim=-1)

    return embed


def llama_cpp_embedder(
    path: Path, gguf_type: str, pooling: str, threads: int, max_tokens: int
) -> Embedder:
    """llama.cpp's embedding mode on the checkpoint's GGUF of ``gguf_type`` (``bf16``,
    ``f32``); raises PeerUnavailable."""
    from pace_bench import peers

    ll = peers.find_llama_cpp()
    if ll is None:
        raise peers.PeerUnavailable("llama-cpp-python is not installed (make bench-peers)")
    mode = {"last": ll.LLAMA_POOLING_TYPE_LAST, "mean": ll.LLAMA_POOLING_TYPE_MEAN}[pooling]
    n = max(512, max_tokens)  # one decode per call: the whole batch in one ubatch
    llm = ll.Llama(model_path=str(peers.gguf_for(path, gguf_type)), embedding=True,
                   pooling_type=mode, n_ctx=n, n_batch=n, n_ubatch=n, n_threads=threads,
                   n_threads_batch=threads, verbose=False)  # fmt: skip
    return lambda texts: torch.tensor(llm.embed(texts, normalize=True))


def load_engines(path: Path, args: argparse.Namespace, threads: int) -> dict[str, Embedder]:
    """engine -> embedder for one model, in ``--engines`` order; unavailable peers noted."""
    engines: dict[str, Embedder] = {}
    for engine in args.engines:
        if engine.startswith("pace-"):
            dtype = torch.bfloat16 if engine == "pace-bf16" else torch.float32
            engines[engine] = pace_embedder(path, dtype, args.pooling)
        elif engine == "transformers":
            engines[engine] = transformers_embedder(path, args.pooling, args.hf_attn)
        else:
            from pace_bench.peers import PeerUnavailable

            longest = max(args.batches) * (max(args.lengths) + 2)
            gguf_type = "bf16" if engine == "llama.cpp-bf16" else "f32"
            try:
                engines[engine] = llama_cpp_embedder(path, gguf_type, args.pooling, threads,
                                                     longest)  # fmt: skip
            except PeerUnavailable as exc:
                note(args, f"embeddings: {engine} skipped: {exc}")
    return engines


def measure(
    engines: dict[str, Embedder], texts: list[str], repeats: int
) -> dict[str, dict[str, float | None]]:
    """Median seconds per call of every engine (round-robin) and the worst cosine of its
    vectors to transformers' (those of the last timed calls), when transformers ran."""
    times, vectors = interleaved_results(
        {name: partial(fn, texts) for name, fn in engines.items()}, repeats
    )
    reference = vectors.get("transformers")
    out: dict[str, dict[str, float | None]] = {}
    for name, t in times.items():
        cosine = None
        if reference is not None:
            cosine = float(torch.cosine_similarity(vectors[name].float(), reference).min())
        out[name] = {"seconds": statistics.median(t), "cosine": cosine}
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    saved = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    rows: list[dict[str, Any]] = []
    cosines: dict[str, list[float]] = {}
    try:
        for name in args.models:
            path = model_path(name)
            tok = AutoTokenizer.from_pretrained(str(path))
            engines = load_engines(path, args, threads)
            points = [(b, n) for n in args.lengths for b in args.batches]
            for batch, length in progress(points, f"embeddings {name}", args.quiet):
                texts = make_texts(tok, batch, length)
                tokens = sum(len(tok(t)["input_ids"]) for t in texts)
                got = measure(engines, texts, args.repeats)
                hf = got.get("transformers", {}).get("seconds")
                for engine, m in got.items():
                    sec, cos = m["seconds"], m["cosine"]
                    if cos is not None:
                        cosines.setdefault(engine, []).append(cos)
                    rows.append({
                        "model": name, "batch": batch, "length": length, "engine": engine,
                        "inputs_s": round(batch / sec, 2), "tokens_s": round(tokens / sec, 1),
                        "ms": round(sec * 1e3, 2),
                        "vs_hf": None if hf is None else round(hf / sec, 2),
                        "cosine_vs_hf": None if cos is None else round(cos, 6),
                    })  # fmt: skip
        note(args, f"embeddings: {threads} thread(s), {args.pooling} pooling")
    finally:
        torch.set_num_threads(saved)
    payload = emit("embeddings", rows, COLUMNS, args)
    summary = [target_row(f"{engine} cosine vs transformers", cosines[engine], minimum)
               for engine, minimum in TARGETS.items() if cosines.get(engine)]  # fmt: skip
    return with_targets(payload, summary, args.quiet)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench embeddings [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("embeddings", argv)
