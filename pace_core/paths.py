"""Where pace keeps what it downloads and builds: ``$PACE_CACHE_DIR``, else ``~/.cache/pace``.

``models/`` holds the zoo's converted models (:mod:`pace_core.zoo`), ``kernels/`` the JIT-built
C++ extensions (:mod:`pace_core.jit`), ``peers/`` the benchmark peers' tools, ``random/`` the
benchmarks' random-weight models (:mod:`pace_core.bench.random_models`).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$PACE_CACHE_DIR`` or ``~/.cache/pace``."""
    env = os.environ.get("PACE_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "pace"
