"""``pace build-kernels``: run the plugins' ahead-of-time build steps and report each one.

JIT-built backends (avx512, tpp, onednn) compile on first use; a build step lets a user (or a
container image) pay that cost up front, see how long it took, and retry a failed build.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from pace_core.errors import ConfigError
from pace_core.plugins import PluginHost
from pace_core.registry import BuildNotApplicable


@dataclass(frozen=True)
class BuildOutcome:
    backend: str
    plugin: str
    status: str  # "ok", "skipped" or "failed"
    seconds: float
    detail: str  # where the build lives, why it was skipped, or the error


def run_builds(host: PluginHost, backends: Iterable[str] | None = None) -> list[BuildOutcome]:
    """Run the build steps of ``backends`` (default: all registered), in name order."""
    known = host.builds
    wanted = sorted(known) if backends is None else list(backends)
    unknown = [b for b in wanted if b not in known]
    if unknown:
        choices = ", ".join(sorted(known)) or "none (no plugin offers a build step)"
        raise ConfigError(f"no build step for backend(s) {', '.join(unknown)}; have: {choices}")
    outcomes = []
    for backend in wanted:
        spec = known[backend]
        start = time.perf_counter()
        try:
            status, detail = "ok", str(spec.fn())
        except BuildNotApplicable as exc:
            status, detail = "skipped", str(exc)
        except Exception as exc:  # a build failure is reported, the other builds still run
            status, detail = "failed", f"{type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - start
        outcomes.append(BuildOutcome(backend, spec.plugin, status, seconds, detail))
    return outcomes


def first_line(text: str) -> str:
    return (text.strip() or "-").splitlines()[0]


def outcomes_table(outcomes: list[BuildOutcome]) -> str:
    """One row per build: backend, plugin, status, seconds and the first line of the detail."""
    from pace_core.report import format_table

    rows = [
        [o.backend, o.plugin, o.status, f"{o.seconds:.1f}", first_line(o.detail)] for o in outcomes
    ]
    return format_table(["backend", "plugin", "status", "seconds", "detail"], rows)
