"""Shared helpers of the benchmarks: timing, medians, machine facts, progress, JSON + table.

Every benchmark module builds its rows and hands them to :func:`emit`, which returns the JSON
payload ``{"benchmark", "machine", "args", "results"}`` and prints a table (unless quiet);
:func:`write_results` stores it as ``<name>.json`` next to ``machine.json``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata as metadata
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")
Columns = Sequence[str] | Mapping[str, Sequence[str]]  # one table, or one per "section"


# -- machine ----------------------------------------------------------------------------------
def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _physical_cores() -> int | None:
    """Distinct (package, core id) pairs of /proc/cpuinfo; None where it is not readable."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    cores, package = set(), "0"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "physical id":
            package = value.strip()
        elif key.strip() == "core id":
            cores.add((package, value.strip()))
    return len(cores) or None


def usable_cores() -> int | None:
    """CPUs this process may run on (its affinity mask)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def plugin_versions() -> dict[str, dict[str, str]]:
    """Every pace plugin the host knows: name -> distribution, version and status."""
    from pace_core.plugins import get_host

    return {
        name: {
            "distribution": info.distribution or info.origin,
            "version": info.version,
            "status": info.status,
        }
        for name, info in get_host().plugins.items()
    }


def machine_info() -> dict[str, Any]:
    """CPU (model, ISA level, flags), core counts, load, library and plugin versions."""
    from pace_core import __version__
    from pace_core.cpu import detect_cpu

    cpu = detect_cpu()
    return {
        "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu.model_name,
        "isa": cpu.isa_level,
        "features": sorted(cpu.features),
        "features_source": cpu.source,
        "cores": {
            "logical": os.cpu_count(),
            "physical": _physical_cores(),
            "usable": usable_cores(),
        },
        "torch_threads": torch.get_num_threads(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            "pace": __version__,
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "llama_cpp_python": _version("llama-cpp-python"),
            "matplotlib": _version("matplotlib"),
        },
        "plugins": plugin_versions(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "KMP_", "PACE_"))},
    }


# -- timing -----------------------------------------------------------------------------------
def keep_backend(names: list[str] | None, backend: str) -> bool:
    """Whether ``--backends names`` (None: all) selects ``backend``."""
    return names is None or backend in names


def interleaved(
    fns: Mapping[str, Callable[[], Any]],
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Seconds of each fn per round, timed round-robin after one warm-up call each.

    Running the contenders of one configuration in turn within every round means load from
    other processes hits them alike, so their ratio stays meaningful on a shared machine.
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return times


def interleaved_results(
    fns: Mapping[str, Callable[[], R]], repeats: int
) -> tuple[dict[str, list[float]], dict[str, R]]:
    """:func:`interleaved` keeping what each fn returned last (to check engines against each
    other on the very calls that were timed)."""
    results: dict[str, R] = {}

    def keep(name: str, fn: Callable[[], R]) -> Callable[[], None]:
        return lambda: results.__setitem__(name, fn())

    times = interleaved({name: keep(name, fn) for name, fn in fns.items()}, repeats)
    return times, results


# -- small shared pieces ------------------------------------------------------------------------
def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def model_path(name: str | Path) -> Path:
    """A zoo model name (prepared on first use), ``random:<shape>`` (a random-weight model with
    real layer shapes, :mod:`pace_bench.random_models`), a path or a hub id in the HF cache
    (anything else: a ModelLoadError naming the choices, before the run)."""
    from pace_bench.random_models import is_random_name, random_model
    from pace_core import zoo

    text = str(name)
    if is_random_name(text):
        return random_model(text)
    if zoo.is_zoo_name(text):
        return zoo.pull(text, quiet=True)
    if Path(text).exists():
        return Path(text)
    from pace_core.models.loader import resolve_model_path

    return resolve_model_path(text)  # a hub id in the HF cache, else a ModelLoadError


def vocab_size(path: Path) -> int:
    """The (text) vocabulary size of the model in ``path``."""
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(str(path)).get_text_config().vocab_size)


def random_prompts(vocab: int, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """``[batch, length]`` random ids in [100, 5000), within the vocabulary when it is small."""
    high = min(5000, vocab)
    return torch.randint(min(100, high // 2), high, (batch, length), generator=gen)


TEXT_WORDS = ("river", "stone", "market", "window", "engine", "garden", "letter", "music",
              "winter", "orange", "doctor", "island", "silver", "planet", "forest", "coffee",
              "bridge", "teacher", "summer", "language", "mountain", "question", "paper",
              "history", "evening", "village", "science", "kitchen", "picture",
              "station")  # fmt: skip
"""Common English words: the benchmarks' texts (:func:`make_texts`)."""


def make_texts(tokenizer: Any, batch: int, length: int, seed: int = 0) -> list[str]:
    """``batch`` different texts of about ``length`` tokens (random words cut at a token)."""
    rng = random.Random(seed * 7919 + length)
    texts = []
    for _ in range(batch):
        words = rng.choices(TEXT_WORDS, k=length)
        ids = tokenizer(" ".join(words))["input_ids"][:length]
        texts.append(tokenizer.decode(ids))
    return texts


def progress(items: Iterable[T], desc: str, quiet: bool, total: int | None = None) -> Iterator[T]:
    """A tqdm bar on stderr over the sweep points (nothing when ``quiet``)."""
    from tqdm.auto import tqdm

    yield from tqdm(
        items,
        desc=desc,
        total=total,
        disable=quiet,
        file=sys.stderr,
        leave=False,
        dynamic_ncols=True,
    )


def warn(message: str) -> None:
    """A warning on stderr, even with ``--quiet``."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def note(args: argparse.Namespace, message: str) -> None:
    """A line for the reader on stderr (suppressed by ``--quiet``)."""
    if not getattr(args, "quiet", False):
        print(message, file=sys.stderr, flush=True)


# -- output -----------------------------------------------------------------------------------
def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return "-" if v is None else str(v)


def format_rows(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A plain-text table of ``rows`` (missing cells as ``-``)."""
    from pace_core.report import format_table

    return format_table(list(columns), [[_fmt(r.get(c)) for c in columns] for r in rows])


def tables(rows: Sequence[Mapping[str, Any]], columns: Columns) -> str:
    """One table, or one per ``section`` when ``columns`` maps sections to their columns."""
    if not isinstance(columns, Mapping):
        return format_rows(rows, columns)
    parts = []
    for section, cols in columns.items():
        sub = [r for r in rows if r.get("section") == section]
        if sub:
            parts.append(f"[{section}]\n{format_rows(sub, cols)}")
    return "\n\n".join(parts)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def emit(
    name: str, rows: list[dict[str, Any]], columns: Columns, args: argparse.Namespace
) -> dict[str, Any]:
    """Print the table(s) to stdout (unless ``args.quiet``) and return the JSON payload.

    ``machine`` is ``args.machine`` when the caller took it before the run (``pace bench``
    does), else taken now. A shrunken affinity mask is recorded (``usable_at_end``) and
    reported: something in the process pinned it, and multi-thread rows are then suspect.
    """
    settings = {
        k: _jsonable(v) for k, v in vars(args).items() if k != "machine" and not callable(v)
    }
    machine = dict(getattr(args, "machine", None) or machine_info())
    if machine["cores"]["usable"] != usable_cores():
        machine["cores"]["usable_at_end"] = usable_cores()
        warn(
            f"{name}: CPU affinity shrank during the run to {usable_cores()} core(s) (from "
            f"{machine['cores']['usable']}): something in this process pinned it, so "
            "multi-thread rows are suspect"
        )
    payload = {"benchmark": name, "machine": machine, "args": settings, "results": rows}
    if not getattr(args, "quiet", False):
        print(tables(rows, columns), flush=True)
    return payload


def write_results(out_dir: Path, payload: Mapping[str, Any]) -> list[Path]:
    """Write ``<out_dir>/<benchmark>.json`` and ``machine.json``; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = out_dir / f"{payload['benchmark']}.json"
    machine = out_dir / "machine.json"
    result.write_text(json.dumps(payload, indent=2) + "\n")
    machine.write_text(json.dumps(payload["machine"], indent=2) + "\n")
    return [machine, result]


def read_results(folder: Path) -> list[dict[str, Any]]:
    """Every benchmark payload (``*.json`` with a ``benchmark`` key) in a results folder."""
    payloads = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "benchmark" in data and "results" in data:
            payloads.append(data)
    return payloads


def target_row(target: str, values: Sequence[float], minimum: float) -> dict[str, Any]:
    """One target of a benchmark's summary: the worst and best ratio measured, and whether
    the worst meets ``minimum``."""
    return {"target": f"{target} >= {minimum}", "worst": min(values), "best": max(values),
            "met": min(values) >= minimum}  # fmt: skip


def ceiling_row(target: str, values: Sequence[float], maximum: float) -> dict[str, Any]:
    """A target a measured value must stay under (an error, a latency): the worst is the
    largest value measured."""
    return {"target": f"{target} <= {maximum}", "worst": max(values), "best": min(values),
            "met": max(values) <= maximum}  # fmt: skip


def with_targets(
    payload: dict[str, Any], summary: list[dict[str, Any]], quiet: bool
) -> dict[str, Any]:
    """``payload`` with its ``summary`` of :func:`target_row` rows, printed unless ``quiet``."""
    payload["summary"] = summary
    if not quiet:
        for s in summary:
            verdict = "met" if s["met"] else "NOT met"
            print(f"{s['target']}: worst {s['worst']:.3g}, best {s['best']:.3g} -> {verdict}")
    return payload


def usable_kernels(op: str, dtype: torch.dtype, **attrs: Any) -> dict[str, Any]:
    """backend -> KernelSpec for every registered kernel of ``op`` usable on this CPU."""
    from pace_core.cpu import detect_cpu
    from pace_core.plugins import get_host
    from pace_core.registry import OpContext

    ctx, features = OpContext(op, dtype, attrs), detect_cpu().features
    return {s.backend: s for s in get_host().ops.where(op=op) if s.check(ctx, features) is None}


def parse_shape(text: str) -> tuple[int, int]:
    """``"KxN"`` -> (K, N) (a weight shape option of the kernel benchmarks)."""
    k, sep, n = text.lower().partition("x")
    if not sep or not k.isdigit() or not n.isdigit():
        raise argparse.ArgumentTypeError(f"shape {text!r}: write KxN, e.g. 576x1536")
    return int(k), int(n)


def stream_read_fn() -> Callable[[torch.Tensor], Any] | None:
    """pace-avx512's streaming-read reference (DRAM bandwidth), when that plugin is usable."""
    if "avx512" not in usable_kernels("linear", torch.bfloat16):
        return None
    from pace_avx512.build import load_extension

    return load_extension().stream_read


def read_buffer(nbytes: int) -> torch.Tensor:
    """``nbytes`` of ones for the streaming-read reference: in pace-avx512's huge-page arena
    when that plugin is usable, the memory its packed weights live in (a read of 4 KB pages
    ran 10-20% below one of huge pages on Zen 4), else plain torch memory."""
    if stream_read_fn() is None:
        return torch.ones(nbytes, dtype=torch.uint8)
    from pace_avx512.build import load_extension

    return load_extension().huge_page_empty(1, nbytes).view(-1).fill_(1)


def sweep(call, x, packed: list) -> Callable[[], None]:
    """One timed run: a call on each matrix of the set in turn (cold weights)."""

    def run():
        for p in packed:
            call(x, p)

    return run


def add_rows(rows, times, rate, ref: str | None, **fields) -> dict[str, float]:
    """One row per backend: ``rate(seconds)`` of the median and of the best round."""
    med = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        row = {**fields, "backend": name, "value": rate(med[name]), "best": rate(min(t))}
        if ref in med:
            row["vs_torch" if ref == "torch" else "vs_native"] = med[ref] / med[name]
        rows.append(row)
    return med


# -- measuring processes ----------------------------------------------------------------------
def process_memory() -> tuple[int, int]:
    """(RSS, peak RSS) of this process in bytes, from ``/proc/self/status``."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def run_child(code: str, args: Sequence[str], what: str) -> dict[str, Any]:
    """Run ``python -c code *args`` (a fresh process: its peaks are its own) and return the
    JSON object its last line of stdout prints; RuntimeError naming ``what`` if it fails."""
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"{what} failed: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
