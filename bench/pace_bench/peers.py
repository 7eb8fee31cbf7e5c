"""Peer engines installed on this machine, for side-by-side benchmarks.

- ``transformers`` is a dependency of pace, so always there (:func:`find_transformers`).
- llama.cpp through ``llama-cpp-python`` when installed (:func:`find_llama_cpp`); ``make
  bench-peers`` builds it from the sdist with ``-DGGML_NATIVE=ON`` and extracts the sdist's
  ``convert_hf_to_gguf.py`` (with its ``conversion`` package and bundled ``gguf-py``, not the
  PyPI ``gguf``) into :func:`converter_dir`, ``$PACE_CACHE_DIR/peers/llama.cpp``.
- :func:`gguf_for` converts a Hugging Face model directory to GGUF once (cached next to the
  model); :class:`LlamaCppRunner` times prefill and decode on it.

``python -m pace_bench.peers extract SDIST`` does the extraction step of ``make
bench-peers``; ``python -m pace_bench.peers status`` shows what is found.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from pace_core.errors import PaceError

CONVERTER = "convert_hf_to_gguf.py"
_CONVERTER_PARTS = (CONVERTER, "conversion/", "gguf-py/", "LICENSE")  # what `extract` keeps
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")


class PeerUnavailable(PaceError):
    """A peer engine or its tooling is missing; the message says how to get it."""


def find_transformers() -> ModuleType | None:
    """The ``transformers`` module, or None."""
    try:
        import transformers
    except ImportError:
        return None
    return transformers


def find_llama_cpp() -> ModuleType | None:
    """The ``llama_cpp`` module of llama-cpp-python, or None when absent or unloadable."""
    try:
        import llama_cpp
    except (ImportError, OSError):  # OSError: the shared library failed to load
        return None
    return llama_cpp


def converter_dir() -> Path:
    """Where ``make bench-peers`` puts the converter: ``$PACE_CACHE_DIR/peers/llama.cpp``."""
    from pace_core.paths import cache_root

    return cache_root() / "peers" / "llama.cpp"


def find_converter() -> Path | None:
    """``convert_hf_to_gguf.py`` (with its ``gguf-py``): the one ``make bench-peers`` extracted,
    else the newest llama.cpp tree's (``make bench-llama-cpp``), or None."""
    from pace_bench.llama_cpp_tools import tree

    for script in (converter_dir() / CONVERTER, tree() / "llama.cpp" / CONVERTER):
        if script.is_file() and (script.parent / "gguf-py").is_dir():
            return script
    return None


def extract_converter(sdist: Path, dest: Path | None = None) -> Path:
    """Copy the converter, its ``conversion`` package and ``gguf-py`` out of the sdist."""
    dest = dest or converter_dir()
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            _, sep, rel = member.name.partition("/vendor/llama.cpp/")
            if not sep or not member.isfile() or not rel.startswith(_CONVERTER_PARTS):
                continue
            if ".." in Path(rel).parts:
                raise PeerUnavailable(f"unsafe path in {sdist}: {member.name}")
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            target.write_bytes(source.read())
    if not (dest / CONVERTER).is_file():
        raise PeerUnavailable(f"{sdist} holds no vendor/llama.cpp/{CONVERTER}")
    return dest / CONVERTER


def _newest_input(model_dir: Path) -> float:
    files = [p for p in model_dir.iterdir() if p.suffix in (".json", ".safetensors", ".bin")]
    return max((p.stat().st_mtime for p in files), default=0.0)


def gguf_path(model_dir: Path, dtype: str) -> Path:
    """``<model_dir>/<name>.<dtype>.gguf``, or under ``$PACE_CACHE_DIR/peers/gguf/`` when the
    model directory is not writable."""
    name = f"{model_dir.name}.{dtype}.gguf"
    if os.access(model_dir, os.W_OK):
        return model_dir / name
    digest = hashlib.sha256(str(model_dir).encode()).hexdigest()[:16]
    return converter_dir().parent / "gguf" / digest / name


def gguf_for(model_dir: str | Path, dtype: str = "bf16", *, quiet: bool = True) -> Path:
    """A GGUF of the Hugging Face model in ``model_dir``, converted on first use.

    The file (see :func:`gguf_path`) is converted again when the model files are newer.
    Raises :class:`PeerUnavailable` when the converter is not installed.
    """
    model_dir = Path(model_dir).resolve()
    if dtype not in GGUF_TYPES:
        raise PeerUnavailable(f"GGUF dtype {dtype!r} unsupported (choose from {GGUF_TYPES})")
    out = gguf_path(model_dir, dtype)
    if out.is_file() and out.stat().st_mtime >= _newest_input(model_dir):
        return out
    script = find_converter()
    if script is None:
        raise PeerUnavailable(
            f"llama.cpp's {CONVERTER} is not installed in {converter_dir()}: run `make "
            "bench-peers` or `make bench-llama-cpp` (or `python -m pace_bench.peers extract "
            "<llama-cpp-python sdist>`)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    paths = [str(script.parent / "gguf-py"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    env.pop("NO_LOCAL_GGUF", None)  # the converter then puts its own gguf-py first as well
    cmd = [sys.executable, str(script), str(model_dir), "--outfile", str(tmp), "--outtype", dtype]
    done = subprocess.run(cmd, env=env, capture_output=quiet, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        detail = (done.stderr or "")[-2000:] if quiet else ""
        raise PeerUnavailable(f"GGUF conversion of {model_dir} failed:\n{detail}")
    tmp.replace(out)
    return out


# llama.cpp's own quantizer (llama_model_quantize): ftype codes of llama.h's llama_ftype
LLAMA_FTYPES = {"q8_0": 7, "q4_0": 2, "q4_1": 3, "q4_k_m": 15, "q5_k_m": 17, "q6_k": 18}


def quantized_gguf(model_dir: str | Path, ftype: str, *, quiet: bool = True) -> Path:
    """The model quantized to ``ftype`` by llama.cpp's own quantizer from its BF16 GGUF (what
    ``llama-quantize model.bf16.gguf out.gguf Q4_0`` makes), made on first use."""
    if ftype not in LLAMA_FTYPES:
        known = ", ".join(LLAMA_FTYPES)
        raise PeerUnavailable(f"llama.cpp ftype {ftype!r} unknown (choose from {known})")
    require_quantizer()
    source = gguf_for(model_dir, "bf16", quiet=quiet)
    out = source.with_name(source.name.replace(".bf16.gguf", f".{ftype}.gguf"))
    if out.is_file() and out.stat().st_mtime >= source.stat().st_mtime:
        return out
    quantize_gguf(source, out, ftype, quiet=quiet)
    return out


def require_quantizer() -> None:
    """Raise :class:`PeerUnavailable` (naming both make targets) when neither llama.cpp
    quantizer is installed: llama-cpp-python's or the newest tree's ``llama-quantize``."""
    from pace_bench import llama_cpp_tools

    if find_llama_cpp() is None and llama_cpp_tools.find_tool("llama-quantize") is None:
        raise PeerUnavailable(
            "llama.cpp's quantizer is not installed: run `make bench-peers` (llama-cpp-python) "
            "or `make bench-llama-cpp` (llama-quantize)"
        )


def quantize_gguf(
    source: Path, out: Path, ftype: str, *, requantize: bool = False, quiet: bool = True
) -> None:
    """``out`` = ``source`` quantized to ``ftype`` by llama.cpp's own quantizer: through
    llama-cpp-python where installed, else the newest tree's ``llama-quantize``."""
    from pace_bench import llama_cpp_tools

    if find_llama_cpp() is not None:
        llama_quantize(source, out, ftype, requantize=requantize, quiet=quiet)
    else:
        llama_cpp_tools.quantize(source, out, ftype, requantize=requantize)


def llama_quantize(
    source: Path, out: Path, ftype: str, *, requantize: bool = False, quiet: bool = True
) -> None:
    """``out`` = the GGUF ``source`` quantized to ``ftype`` (:data:`LLAMA_FTYPES`) by
    llama.cpp's own quantizer through llama-cpp-python (``requantize``: from an already
    quantized file, ``llama-quantize --allow-requantize``)."""
    import ctypes

    llama_cpp = find_llama_cpp()
    if llama_cpp is None:
        raise PeerUnavailable("llama-cpp-python is not installed: run `make bench-peers`")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPES[ftype]
    params.nthread = os.cpu_count() or 1
    params.allow_requantize = requantize
    tmp = out.with_suffix(".tmp")
    with _c_stdout_silenced(quiet):  # the quantizer prints a line per tensor from C
        code = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(),
                                              ctypes.byref(params))  # fmt: skip
    if code != 0:
        tmp.unlink(missing_ok=True)
        raise PeerUnavailable(f"llama.cpp could not quantize {source} to {ftype} (code {code})")
    tmp.replace(out)


@contextlib.contextmanager
def _c_stdout_silenced(quiet: bool) -> Iterator[None]:
    """File descriptor 1 sent to /dev/null while the block runs (C code's prints too)."""
    if not quiet:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as sink:
            os.dup2(sink.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def greedy_token(logits: Any, n_vocab: int) -> int:
    """The argmax of a llama.cpp logits row (a ctypes float pointer of ``n_vocab`` values)."""
    import numpy as np

    return int(np.ctypeslib.as_array(logits, shape=(n_vocab,)).argmax())


class LlamaCppRunner:
    """A GGUF model in llama.cpp with ``n_threads``: timed prefill and greedy decode.

    ``prefill(tokens)`` evaluates a prompt from an empty cache; ``generate(tokens, n)`` adds
    ``n`` greedy tokens after it (one ``eval`` of one token per step, argmax of the logits).
    """

    def __init__(self, gguf: str | Path, n_threads: int, n_ctx: int = 4096) -> None:
        llama_cpp = find_llama_cpp()
        if llama_cpp is None:
            raise PeerUnavailable("llama-cpp-python is not installed: run `make bench-peers`")
        self.llm = llama_cpp.Llama(
            model_path=str(gguf),
            n_ctx=n_ctx,
            n_batch=min(n_ctx, 512),
            n_threads=n_threads,
            n_threads_batch=n_threads,
            verbose=False,
        )
        self.n_threads = n_threads

    def prefill(self, tokens: list[int]) -> None:
        self.llm.reset()
        self.llm.eval(tokens)

    def _next_token(self) -> int:
        return greedy_token(self.llm._ctx.get_logits(), self.llm.n_vocab())  # the last row

    def generate(self, tokens: list[int], new_tokens: int) -> list[int]:
        """Prefill ``tokens`` then decode ``new_tokens`` greedily (the first from the prefill)."""
        self.prefill(tokens)
        out = [self._next_token()]
        while len(out) < new_tokens:
            self.llm.eval([out[-1]])
            out.append(self._next_token())
        return out

    def measure(self, tokens: list[int], new_tokens: int, repeats: int = 3) -> dict[str, float]:
        """Median prefill time of ``tokens`` and decode tok/s over ``new_tokens``."""
        from pace_bench.common import interleaved

        fns = {
            "prefill": lambda: self.generate(tokens, 1),
            "total": lambda: self.generate(tokens, new_tokens),
        }
        med = {k: sorted(v)[len(v) // 2] for k, v in interleaved(fns, repeats).items()}
        decode_s = max(med["total"] - med["prefill"], 1e-9)
        return {
            "ttft_s": med["prefill"],
            "prefill_tok_s": len(tokens) / med["prefill"],
            "decode_tok_s": (new_tokens - 1) / decode_s,
        }


class LlamaCppBatchRunner:
    """Greedy decode of ``n_seq`` sequences at once in one llama.cpp context (llama.cpp's own
    batched decoding, as its ``llama-batched`` example does): all prompts in one
    ``llama_decode``, then one ``llama_decode`` of ``n_seq`` tokens per step, each sequence in
    its own part of the KV cache."""

    def __init__(self, gguf: str | Path, n_threads: int, n_seq: int, n_ctx: int) -> None:
        ll = find_llama_cpp()
        if ll is None:
            raise PeerUnavailable("llama-cpp-python is not installed: run `make bench-peers`")
        self._ll, self.n_seq = ll, n_seq
        self.llm = ll.Llama(model_path=str(gguf), n_ctx=64, n_threads=n_threads,
                            n_threads_batch=n_threads, verbose=False)  # fmt: skip
        params = ll.llama_context_default_params()
        per_seq = -(-n_ctx // 256) * 256  # llama.cpp pads contexts to 256: split them evenly
        params.n_ctx = params.n_batch = n_seq * per_seq
        params.n_ubatch = 512
        params.n_seq_max = n_seq
        params.n_threads = params.n_threads_batch = n_threads
        params.no_perf = True
        self.ctx = ll.llama_init_from_model(self.llm._model.model, params)
        if not self.ctx:
            raise PeerUnavailable(f"llama.cpp could not create a context for {n_seq} sequences")
        self.batch = ll.llama_batch_init(params.n_batch, 0, 1)
        self.n_vocab = self.llm.n_vocab()

    def close(self) -> None:
        if self.ctx:
            self._ll.llama_batch_free(self.batch)
            self._ll.llama_free(self.ctx)
            self.ctx = None

    def __del__(self) -> None:
        self.close()

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """One ``llama_decode`` of (token, position, sequence, wants logits) entries."""
        b = self.batch
        for k, (token, pos, seq, logits) in enumerate(entries):
            b.token[k], b.pos[k], b.n_seq_id[k] = token, pos, 1
            b.seq_id[k][0], b.logits[k] = seq, logits
        b.n_tokens = len(entries)
        if self._ll.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def _argmax(self, index: int) -> int:
        """The greedy token after the batch entry ``index`` (its position in the batch)."""
        return greedy_token(self._ll.llama_get_logits_ith(self.ctx, index), self.n_vocab)

    def generate(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        """Prefill every prompt (one call) and decode ``new_tokens`` greedy tokens each (the
        first from the prefill)."""
        self._ll.llama_memory_clear(self._ll.llama_get_memory(self.ctx), True)
        entries = [(t, pos, seq, pos == len(p) - 1)
                   for seq, p in enumerate(prompts) for pos, t in enumerate(p)]  # fmt: skip
        self._decode(entries)
        last = [k for k, entry in enumerate(entries) if entry[3]]  # each prompt end, in the batch
        outputs = [[self._argmax(k)] for k in last]
        for step in range(1, new_tokens):
            self._decode([(out[-1], len(p) + step - 1, seq, True)
                          for seq, (p, out) in enumerate(zip(prompts, outputs))])  # fmt: skip
            for i, out in enumerate(outputs):
                out.append(self._argmax(i))
        return outputs


def status() -> dict[str, Any]:
    """What is found: versions and the converter's location."""
    llama = find_llama_cpp()
    transformers = find_transformers()
    converter = find_converter()
    return {
        "transformers": getattr(transformers, "__version__", None),
        "llama_cpp": getattr(llama, "__version__", None),
        "converter": str(converter) if converter else None,
        "converter_dir": str(converter_dir()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pace_bench.peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="action", required=True)
    ex = sub.add_parser("extract", help="extract the converter from a llama-cpp-python sdist")
    ex.add_argument("sdist", type=Path)
    ex.add_argument("--dest", type=Path, default=None, help=f"default: {converter_dir()}")
    sub.add_parser("status", help="show the peers found")
    conv = sub.add_parser("convert", help="convert a model directory or zoo name to GGUF")
    conv.add_argument("model")
    conv.add_argument("--dtype", default="bf16", choices=GGUF_TYPES)
    args = p.parse_args(argv)
    if args.action == "extract":
        print(extract_converter(args.sdist, args.dest))
    elif args.action == "convert":
        from pace_bench.common import model_path

        start = time.perf_counter()
        path = gguf_for(model_path(args.model), args.dtype, quiet=False)
        print(f"{path} ({time.perf_counter() - start:.1f} s)")
    else:
        for key, value in status().items():
            print(f"{key:14s} {value or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
