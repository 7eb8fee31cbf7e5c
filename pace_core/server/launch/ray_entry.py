"""``import_path`` for Ray Serve config files and KubeRay ``RayService``:
``pace_core.server.launch.ray_entry:app``, built from environment variables (``PACE_MODEL``,
``PACE_REPLICAS``, ``PACE_THREADS``, ``PACE_DTYPE``, ``PACE_MIN_REPLICAS``,
``PACE_MAX_REPLICAS``, ``PACE_SERVED_MODEL_NAME``)."""

from __future__ import annotations

import os

from pace_core.engine.config import EngineConfig
from pace_core.server.frontdoor.context import ServerConfig
from pace_core.server.launch.ray_serve import build_app


def _int(name: str) -> int | None:
    value = os.environ.get(name)
    return None if value in (None, "") else int(value)


def app_from_env() -> object:
    model = os.environ.get("PACE_MODEL", "smollm2")
    name = os.environ.get("PACE_SERVED_MODEL_NAME") or os.path.basename(model.rstrip("/"))
    return build_app(
        {"model": model, "dtype": os.environ.get("PACE_DTYPE", "bfloat16"),
         "kv_cache_type": "paged"},
        EngineConfig(),
        ServerConfig(served_model_name=name),
        replicas=_int("PACE_REPLICAS") or 1,
        min_replicas=_int("PACE_MIN_REPLICAS"),
        max_replicas=_int("PACE_MAX_REPLICAS"),
        threads=_int("PACE_THREADS") or 1,
    )  # fmt: skip


app = app_from_env() if os.environ.get("PACE_MODEL") else None
