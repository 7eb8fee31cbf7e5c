"""Quality of quantized weights: KL divergence, top-1 agreement and perplexity vs a reference.

On a fixed public-domain English text (``pace_core.quality.TEXT``, a few thousand tokens) cut
into windows, per model:

- pace's quantize-on-load presets (``--quantization``) against pace's dense model of the same
  dtype (``--dtype``, bf16 by default);
- with ``--gguf``: the model's original GGUF file run by pace (bf16 and fp32) against
  transformers running the same file de-quantized to fp32 (the zoo's conversion of it);
- with ``--llama-cpp`` (llama-cpp-python installed, ``make bench-peers``): llama.cpp on the
  same GGUF against the same reference, and against pace on that file (the KLD between the two
  engines).

``--llama-quantized q8_0`` (or ``q4_k_m``, ``bf16``, ...) scores llama.cpp on its own
quantization of the same weights (the model's BF16 GGUF through llama.cpp's quantizer) against
the same dense reference as the presets: the peer row next to ``w8a8`` / ``int8`` (its ``bf16``
row is the floor of the two engines' bf16 arithmetic differing).

``--kv-cache-dtype int8`` measures pace's int8 KV cache (dense weights) against the same model
with its KV in the model dtype (variant ``kv int8``).

``--activations exact int8`` measures the quantized bf16 rows in both of pace-avx512's
activation modes (engine ``pace`` for ``exact``, ``pace-a8`` for ``int8``; fp32 models take
15-bit activations in either, so their rows run once).

    pace bench quality --models smollm2 gemma3-270m --gguf --llama-cpp
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from pathlib import Path
from typing import Any

import torch

from pace_bench import activations
from pace_bench.common import emit, model_path, note, progress
from pace_bench.peers import LLAMA_FTYPES
from pace_core.arg_types import at_least
from pace_core.quality import SOURCE, Scorer, compare, text_ids, windows

COLUMNS = ["model", "variant", "engine", "reference", "tokens", "kld_mean", "kld_p99", "top1",
           "ppl_reference", "ppl", "weight_mb", "load_s"]  # fmt: skip
QUICK = {"max_tokens": 1024, "quantization": ["int8", "int4"]}


def gguf_file(name: str) -> Path:
    """The original GGUF of a zoo model (multi-part ones joined once into the pace cache)."""
    from pace_core import zoo

    parts = zoo.gguf_paths(name)
    if len(parts) == 1:
        return parts[0]
    m = zoo.get_model(name)
    dest = zoo.cache_root() / "gguf" / m.gguf_name
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        tmp = dest.with_suffix(".partial")
        with open(tmp, "wb") as out:
            for part in parts:
                data = part.read_bytes()
                digest.update(data)
                out.write(data)
        if digest.hexdigest() != m.sha256:
            tmp.unlink()
            raise RuntimeError(f"{m.gguf_name}: sha256 mismatch after joining its parts")
        tmp.rename(dest)
    return dest


def pace_runner(
    source: Path,
    dtype: torch.dtype,
    quantization: str | None = None,
    mode: str = "exact",
    kv_cache_dtype: str | None = None,
) -> tuple[Any, float]:
    from pace_core import LLMModel

    start = time.perf_counter()
    with activations.loaded_under(mode):
        llm = LLMModel(source, dtype=dtype, quantization=quantization, quiet=True,
                       load_tokenizer=False, kv_cache_dtype=kv_cache_dtype)  # fmt: skip
    return llm, time.perf_counter() - start


def _row(model: str, variant: str, engine: str, reference: str, report, **extra) -> dict:
    return {"model": model, "variant": variant, "engine": engine, "reference": reference,
            **report.as_dict(), **extra}  # fmt: skip


def _llama_cpp_scorer(file: Path, window: int, threads: int) -> Scorer:
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(str(file), n_ctx=window, logits_all=True, n_threads=threads, verbose=False)

    def score(ids: torch.Tensor) -> torch.Tensor:
        llm.reset()
        llm.eval(ids[0].tolist())
        return torch.from_numpy(np.array(llm.scores[: ids.shape[1]], dtype=np.float32))

    return score


def llama_quantized_rows(
    args: argparse.Namespace, name: str, path: Path, reference: Any, chunks: Any, ref_label: str
) -> list[dict[str, Any]]:
    """llama.cpp on each ``--llama-quantized`` GGUF of the model, scored against ``reference``."""
    from pace_bench import peers

    rows = []
    for ftype in args.llama_quantized:
        try:
            file = peers.gguf_for(path, ftype) if ftype == "bf16" else peers.quantized_gguf(
                path, ftype)  # fmt: skip
            scorer = _llama_cpp_scorer(file, args.window, torch.get_num_threads())
        except (peers.PeerUnavailable, ImportError) as exc:
            note(args, f"quality: llama.cpp {ftype} skipped: {exc}")
            continue
        rows.append(_row(name, f"llama.cpp {ftype}", "llama.cpp", ref_label,
                         compare(reference, scorer, chunks),
                         weight_mb=round(file.stat().st_size / 1e6, 1)))  # fmt: skip
    return rows


def bench_model(args: argparse.Namespace, name: str) -> list[dict[str, Any]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pace_core.quant.memory import weight_bytes

    path = model_path(name)
    tok = AutoTokenizer.from_pretrained(str(path))
    ids = text_ids(tok)[: args.max_tokens]
    chunks = windows(ids, args.window, tok.bos_token_id if args.bos else None)
    rows = []
    modes = activations.modes(args)
    dtype = getattr(torch, args.dtype)
    label = f"pace {args.dtype}"
    ref, load = pace_runner(path, dtype)
    mb = round(weight_bytes(ref.model) / 1e6, 1)
    note(args, f"quality: {name}: {len(chunks)} windows of {args.window} tokens ({SOURCE})")
    for preset in args.quantization:
        for mode in activations.for_model(modes, quantized=True, dtype=dtype):
            test, load = pace_runner(path, dtype, preset, mode)
            report = compare(ref.logits, test.logits, chunks)
            rows.append(_row(name, preset, f"{activations.ENGINES[mode]} {args.dtype}",
                             f"{label} (dense)", report,
                             weight_mb=round(weight_bytes(test.model) / 1e6, 1),
                             load_s=round(load, 1)))  # fmt: skip
            del test
    rows += llama_quantized_rows(args, name, path, ref.logits, chunks, f"{label} (dense)")
    for kv in args.kv_cache_dtype:
        test, load = pace_runner(path, dtype, kv_cache_dtype=kv)
        rows.append(_row(name, f"kv {kv}", label, f"{label} (KV {args.dtype})",
                         compare(ref.logits, test.logits, chunks), weight_mb=mb,
                         load_s=round(load, 1)))  # fmt: skip
        del test
    rows.append(_row(name, "dense", label, "-", compare(ref.logits, ref.logits, chunks),
                     weight_mb=mb, load_s=None))  # fmt: skip
    del ref
    if not (args.gguf or args.llama_cpp):
        return rows
    file = gguf_file(name)
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()

    def hf_logits(x: torch.Tensor) -> torch.Tensor:
        return hf(x).logits

    reference = "transformers fp32 (same file de-quantized)"
    variant = f"gguf {file.name}"
    pace_gguf = None
    if args.gguf:
        for dtype in (torch.bfloat16, torch.float32):
            for mode in activations.for_model(modes, quantized=True, dtype=dtype):
                pace_gguf, load = pace_runner(file, dtype, mode=mode)
                report = compare(hf_logits, pace_gguf.logits, chunks)
                rows.append(_row(name, variant, f"{activations.ENGINES[mode]} {str(dtype)[6:]}",
                                 reference, report,
                                 weight_mb=round(weight_bytes(pace_gguf.model) / 1e6, 1),
                                 load_s=round(load, 1)))  # fmt: skip
    if args.llama_cpp:
        try:
            scorer = _llama_cpp_scorer(file, args.window, torch.get_num_threads())
        except ImportError:
            note(args, "quality: llama-cpp-python is not installed (make bench-peers): skipped")
            return rows
        rows.append(_row(name, variant, "llama.cpp", reference,
                         compare(hf_logits, scorer, chunks)))  # fmt: skip
        if pace_gguf is not None:
            rows.append(_row(name, variant, "llama.cpp", "pace fp32 (same file)",
                             compare(pace_gguf.logits, scorer, chunks)))  # fmt: skip
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="+", default=["smollm2"])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--quantization", nargs="*", help="pace quantize-on-load presets to measure",
                   default=["int8", "int8-channel", "int4", "int4-sym"])  # fmt: skip
    p.add_argument("--kv-cache-dtype", nargs="*", default=[], choices=["int8"],
                   help="KV storage dtypes to measure against the model-dtype KV")  # fmt: skip
    p.add_argument("--gguf", action="store_true", help="also the model's original GGUF file")
    p.add_argument("--llama-cpp", action="store_true", help="also llama.cpp on that GGUF file")
    p.add_argument("--llama-quantized", nargs="*", default=[],
                   choices=["bf16", *LLAMA_FTYPES],
                   help="llama.cpp on its own quantization of the same weights, scored against "
                   "the dense reference")  # fmt: skip
    p.add_argument("--window", type=at_least(2), default=512, help="tokens per scored window")
    p.add_argument("--max-tokens", type=at_least(1), default=4096, help="tokens of the text used")
    p.add_argument("--bos", action="store_true", help="start every window with BOS")
    p.add_argument("--threads", type=at_least(1), default=None)
    activations.add_argument(p)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.threads:
        torch.set_num_threads(args.threads)
    note(args, f"quality: threads={torch.get_num_threads()} load_average={os.getloadavg()}")
    rows = []
    for name in progress(args.models, "quality", args.quiet):
        rows += bench_model(args, name)
    return emit("quality", rows, COLUMNS, args)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench quality [argv]``: run, write the results folder, return the payload."""
    from pace_bench.cli import main_for

    return main_for("quality", argv)
