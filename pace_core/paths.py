"""Where pace keeps what it downloads and builds: ``$PACE_CACHE_DIR``, else ``~/.cache/pace``.

``models/`` holds the zoo's converted models (:mod:`pace_core.zoo`), ``kernels/`` the JIT-built
C++ extensions (:mod:`pace_core.jit`), ``peers/`` the benchmark peers' tools, ``random/`` the
benchmarks' random-weight models (:mod:`pace_bench.random_models`), ``gguf-meta/`` and
``tokenizers/`` what was converted from a model file once (:func:`derived_entry`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    """``$PACE_CACHE_DIR`` or ``~/.cache/pace``."""
    env = os.environ.get("PACE_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "pace"


def derived_entry(kind: str, source: Path, label: str) -> Path:
    """``<cache root>/<kind>/<label>-<digest>``: the place of what is derived from ``source``,
    keyed by its resolved path, size and modification time (a changed file gets a new entry)."""
    path = source.resolve()
    stat = path.stat()
    key = f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
    return cache_root() / kind / f"{label}-{hashlib.sha256(key.encode()).hexdigest()[:20]}"
