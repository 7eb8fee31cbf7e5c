"""Shared helpers for the benchmarks: timing, medians, machine facts, JSON + table output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def machine_info() -> dict[str, Any]:
    from pace_core import __version__
    from pace_core.cpu import detect_cpu

    cpu = detect_cpu()
    import transformers

    return {
        "cpu": cpu.model_name,
        "isa": cpu.isa_level,
        "features": sorted(cpu.features),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "pace": __version__,
    }


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``fn`` over ``repeats`` runs (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def emit(name: str, rows: list[dict[str, Any]], columns: list[str], out_dir: str | None) -> None:
    """Print a table and JSON; also write ``<out_dir>/<name>.json`` when asked."""
    payload = {"benchmark": name, "machine": machine_info(), "results": rows}
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns))
    text = json.dumps(payload, indent=2)
    print(text)
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / f"{name}.json").write_text(text)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if v < 10 else f"{v:.1f}"
    return "-" if v is None else str(v)
