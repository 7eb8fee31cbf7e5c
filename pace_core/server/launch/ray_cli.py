"""``pace serve --ray``: start (or join) a Ray cluster and run pace's Ray Serve application
(:mod:`pace_core.server.launch.ray_serve`) on ``--host``/``--port`` until interrupted."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any

from pace_core.errors import ConfigError


def run_ray(args: argparse.Namespace, model_args: dict, engine_config: Any, config: Any) -> int:
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ConfigError(
            "pace serve --ray needs Ray Serve: pip install 'pace-core[ray]'"
        ) from None
    from pace_core.server.launch.ray_serve import build_app

    if args.instances > 1:
        raise ConfigError("--ray and --instances exclude each other: use --replicas")
    for flag in ("replicas", "min_replicas", "max_replicas"):
        value = getattr(args, flag)
        if value is not None and value < (1 if flag == "replicas" else 0):
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1 (got {value})")
    ray.init(address=args.ray_address, ignore_reinit_error=True, log_to_driver=False)
    serve.start(http_options={"host": args.host, "port": args.port})
    app = build_app(
        model_args, engine_config, config, replicas=args.replicas,
        min_replicas=args.min_replicas, max_replicas=args.max_replicas,
        threads=args.threads or 1,
    )  # fmt: skip
    serve.run(app, name="pace", route_prefix="/")
    print(
        f"pace serve: {config.served_model_name} on http://{args.host}:{args.port}/v1 "
        f"(Ray Serve, {args.replicas} replica(s) x {args.threads or 1} thread(s))",
        file=sys.stderr,
        flush=True,
    )
    signal.signal(signal.SIGTERM, _interrupt)  # stop like Ctrl-C: the local cluster too
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
        ray.shutdown()
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
