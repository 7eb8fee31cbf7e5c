"""``pace serve``: wire with ``add_serve_parser(subparsers)`` in the main CLI."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

DTYPE_CHOICES = ("bfloat16", "bf16", "float32", "fp32")


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve [MODEL]`` to an ``argparse`` subparsers object; sets ``func``."""
    p = subparsers.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server with continuous batching",
        description="Serve a model over the OpenAI API (/v1/completions, /v1/chat/completions).",
    )
    p.add_argument("model", nargs="?", default=None, help="model dir, hub id or zoo name")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", default="bfloat16", choices=DTYPE_CHOICES)
    p.add_argument(
        "--kv-cache-type",
        default="paged",
        help="a block cache: paged (default) or slab_pool",
    )
    p.add_argument("--kv-cache-memory-gb", type=float, default=None, help="KV pool size in GiB")
    p.add_argument("--max-cache-tokens", type=int, default=None, help="KV pool size in tokens")
    p.add_argument("--max-running", type=int, default=32, help="sequences decoded together")
    p.add_argument(
        "--max-queue", type=int, default=256, help="waiting sequences per instance before 429"
    )
    p.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=512,
        help="prompt tokens prefilled per iteration (long prompts are chunked)",
    )
    p.add_argument("--instances", type=int, default=1, help="engine processes (cores split)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (single instance)")
    p.add_argument("--api-key", default=os.environ.get("PACE_API_KEY"), help="require Bearer key")
    p.add_argument(
        "--request-timeout", type=float, default=600.0, help="seconds per request (0 = none)"
    )
    p.add_argument("--max-request-bytes", type=int, default=4 << 20, help="request size limit")
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=1024,
        help="max_tokens of chat requests that do not set it",
    )
    p.add_argument("--served-model-name", default=None, help="model id clients send")
    p.add_argument("--opconfig", default=None, help="operator config (JSON or file)")
    p.set_defaults(func=run_serve)
    return p


def build_server(args: argparse.Namespace):
    """The :class:`~pace_core.server.app.Server` described by parsed ``serve`` arguments."""
    from pace_core import zoo
    from pace_core.errors import ConfigError
    from pace_core.server.app import Server, ServerConfig
    from pace_core.server.engine import EngineConfig

    model = args.model or zoo.DEFAULT_MODEL
    if args.kv_cache_type not in ("paged", "slab_pool"):
        from pace_core.plugins import get_host

        spec = get_host().caches.caches.get(args.kv_cache_type)
        if spec is None or spec.layout == "contiguous":
            raise ConfigError(
                f"--kv-cache-type {args.kv_cache_type!r} cannot serve: continuous batching needs "
                "a block cache (paged or slab_pool)"
            )
    if args.instances < 1:
        raise ConfigError("--instances must be >= 1")
    name = args.served_model_name or os.path.basename(str(model).rstrip("/")) or str(model)
    engine_config = EngineConfig(
        max_running=args.max_running,
        max_queue=args.max_queue,
        max_prefill_tokens=args.max_prefill_tokens,
        threads=args.threads,
    )
    config = ServerConfig(
        served_model_name=name,
        aliases=tuple(a for a in {str(model)} if a != name),
        api_key=args.api_key or None,
        max_request_bytes=args.max_request_bytes,
        request_timeout=args.request_timeout or None,
        default_max_tokens=args.default_max_tokens,
    )
    model_args = {
        "model": model,
        "dtype": args.dtype,
        "kv_cache_type": args.kv_cache_type,
        "kv_cache_memory_gb": args.kv_cache_memory_gb,
        "max_cache_tokens": args.max_cache_tokens,
        "opconfig": args.opconfig,
    }
    if args.instances > 1:
        return Server.multi_instance(model_args, args.instances, engine_config, config)
    from pace_core.engine.llm import LLMModel

    llm = LLMModel(**model_args, quiet=True)
    return Server.in_process(llm, engine_config, config)


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from pace_core.server.app import create_app

    level = str(getattr(args, "log_level", None) or "info").lower()
    if not logging.getLogger().handlers:
        logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.instances > 1:
        from pace_core import zoo

        if args.model is None or zoo.is_zoo_name(args.model):
            args.model = str(zoo.pull(args.model or zoo.DEFAULT_MODEL))
    server = build_server(args)
    app = create_app(server)
    print(
        f"pace serve: {server.config.served_model_name} on http://{args.host}:{args.port}/v1 "
        f"({args.instances} instance(s), kv {args.kv_cache_type})",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=level)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m pace_core.server.cli serve ...`` (until ``pace serve`` is wired)."""
    parser = argparse.ArgumentParser(prog="pace")
    parser.add_argument("--log-level", default="info")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    args = parser.parse_args(argv)
    from pace_core.errors import PaceError

    try:
        return args.func(args)
    except PaceError as exc:
        print(f"pace: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
