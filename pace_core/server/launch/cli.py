"""``pace serve``: wire with ``add_serve_parser(subparsers)`` in the main CLI."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pace_core.arg_types import above, at_least

if TYPE_CHECKING:
    from pace_core.platform.placement import InstancePlan

DTYPE_CHOICES = ("bfloat16", "bf16", "float32", "fp32")
_SPEC_EXAMPLE = '{"method": "prompt_lookup", "num_speculative_tokens": 4}'


def spec_config_arg(value: str) -> dict[str, Any]:
    """``--spec-config``: a JSON object or the path of a JSON file, validated as an offline
    ``spec_config`` dict (no model is loaded here). Errors are ``ArgumentTypeError``s, which
    argparse prints with the usage line (exit code 2, no traceback)."""
    from pace_core.errors import ConfigError
    from pace_core.speculative.config import coerce_spec_config

    text = value.strip()
    if not text.startswith(("{", "[")):
        path = Path(value).expanduser()
        if not path.is_file():
            raise argparse.ArgumentTypeError(
                f"{value!r} is neither a JSON object nor a JSON file; pass e.g. "
                f"'{_SPEC_EXAMPLE}' or the path of a file holding such an object"
            )
        try:
            text = path.read_text()
        except OSError as exc:
            raise argparse.ArgumentTypeError(f"cannot read {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"not valid JSON ({exc}); expected an object such as '{_SPEC_EXAMPLE}'"
        ) from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(
            f"expected a JSON object such as '{_SPEC_EXAMPLE}' (got {type(data).__name__})"
        )
    try:
        coerce_spec_config(data)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return data


def instances_arg(value: str) -> int | str:
    """``--instances``: a count, ``auto`` or ``auto-l3`` (argparse error otherwise)."""
    from pace_core.errors import ConfigError
    from pace_core.platform.placement import parse_instances

    try:
        return parse_instances(value)
    except ConfigError as exc:  # argparse names the option itself
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--instances ")) from None


def cpus_arg(value: str) -> list[int]:
    """One ``--instance-cores`` list: ``0-3,8-11``."""
    from pace_core.platform import parse_cpulist

    try:
        cpus = parse_cpulist(value)
    except ValueError:
        cpus = []
    if not cpus:
        raise argparse.ArgumentTypeError(f"{value!r} is not a CPU list; pass e.g. 0-3,8-11")
    return cpus


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve [MODEL]`` to an ``argparse`` subparsers object; sets ``func``."""
    p = subparsers.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server with continuous batching",
        description="Serve a model over the OpenAI API (/v1/completions, /v1/chat/completions).",
    )
    p.add_argument(
        "model", nargs="?", default=None, help="model dir, GGUF file, hub id or zoo name"
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=at_least(0, maximum=65535), default=8000)
    p.add_argument("--dtype", default="bfloat16", choices=DTYPE_CHOICES)
    from pace_core.caches.disk_tier import DEFAULT_DISK_GB
    from pace_core.caches.kv_quant import add_kv_cache_dtype_argument
    from pace_core.quant.config import add_quantization_argument

    add_quantization_argument(p)
    p.add_argument(
        "--kv-cache-type",
        default="paged",
        help="a block cache: paged (default) or slab_pool",
    )
    add_kv_cache_dtype_argument(p)
    p.add_argument("--kv-cache-memory-gb", type=above(0), default=None, help="KV pool size in GiB")
    p.add_argument(
        "--max-cache-tokens", type=at_least(1), default=None, help="KV pool size in tokens"
    )
    p.add_argument("--max-running", type=at_least(1), default=32, help="sequences decoded together")
    p.add_argument(
        "--max-queue",
        type=at_least(0),
        default=256,
        help="waiting sequences per instance before 429",
    )
    p.add_argument(
        "--max-prefill-tokens",
        type=at_least(1),
        default=512,
        help="prompt tokens prefilled per iteration (long prompts are chunked)",
    )
    p.add_argument(
        "--prefill-slice-ms",
        type=at_least(0, float),
        default=50.0,
        help="while sequences decode, prefill about this much work per iteration so their "
        "next token waits at most one short chunk (0: always --max-prefill-tokens)",
    )
    p.add_argument(
        "--no-mixed-steps",
        dest="mixed_steps",
        action="store_false",
        help="run prompt chunks and decodes as separate forwards even when the decoder stack "
        "packs ragged steps (for comparisons)",
    )
    p.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="do not reuse the KV of prompt prefixes computed before (automatic prefix "
        "caching over full KV blocks; see docs/server.md)",
    )
    p.add_argument(
        "--prefix-cache-dir",
        default=None,
        help="keep prefix-cached KV blocks in this directory too: evicted blocks and, when the "
        "engine is idle or stops, every cached one; the next start restores them on a hit "
        "(only for the same model, weights, dtype and quantization; see docs/server.md)",
    )
    p.add_argument(
        "--prefix-cache-disk-gb",
        type=above(0),
        default=DEFAULT_DISK_GB,
        help="size cap of --prefix-cache-dir in GiB (least recently used blocks go first)",
    )
    p.add_argument(
        "--instances",
        type=instances_arg,
        default=1,
        help="engine processes: N (physical cores split N ways), auto (one per NUMA node) or "
        "auto-l3 (one per L3 domain); see docs/server.md",
    )
    p.add_argument(
        "--instance-cores",
        nargs="+",
        type=cpus_arg,
        default=None,
        metavar="CPUS",
        help="one engine process per CPU list, e.g. 0-15 16-31 (instead of --instances)",
    )
    p.add_argument(
        "--tensor-parallel",
        type=at_least(1),
        default=1,
        metavar="N",
        help="split the model across N ranks (processes, one per NUMA node with --instances "
        "auto): each --instances group is N ranks; see docs/server.md",
    )
    ray = p.add_argument_group("Ray Serve (pip install 'pace-core[ray]'; see docs/server.md)")
    ray.add_argument("--ray", action="store_true", help="serve with Ray Serve replicas")
    ray.add_argument(
        "--ray-address",
        default=None,
        help="Ray cluster to join ('auto' = the running one; default: start a local one)",
    )
    ray.add_argument("--replicas", type=at_least(1), default=1, help="engine replicas (--ray)")
    ray.add_argument(
        "--min-replicas", type=at_least(0), default=None, help="autoscale from (--ray)"
    )
    ray.add_argument(
        "--max-replicas", type=at_least(1), default=None, help="autoscale up to (--ray)"
    )
    p.add_argument("--threads", type=at_least(1), default=None,
                   help="torch threads (single instance)")  # fmt: skip
    p.add_argument("--api-key", default=os.environ.get("PACE_API_KEY"), help="require Bearer key")
    p.add_argument(
        "--request-timeout",
        type=at_least(0, float),
        default=600.0,
        help="seconds per request (0 = none)",
    )
    p.add_argument(
        "--max-request-bytes", type=at_least(1), default=4 << 20, help="request size limit"
    )
    p.add_argument(
        "--default-max-tokens",
        type=at_least(1),
        default=1024,
        help="max_tokens of chat requests that do not set it",
    )
    p.add_argument("--served-model-name", default=None, help="model id clients send")
    p.add_argument(
        "--no-ui", dest="ui", action="store_false", help="do not serve the chat page at /"
    )
    p.add_argument("--opconfig", default=None, help="operator config (JSON or file)")
    p.add_argument(
        "--spec-config",
        type=spec_config_arg,
        default=None,
        help="speculative decoding, as LLMModel's spec_config: JSON or a JSON file, e.g. "
        + _SPEC_EXAMPLE.replace("%", "%%")
        + " (methods: prompt_lookup/ngram, draft, pard; see docs/speculative.md)",
    )
    p.set_defaults(func=run_serve)
    return p


def build_server(args: argparse.Namespace):
    """The :class:`~pace_core.server.api.app.Server` described by parsed ``serve`` arguments."""
    from pace_core.server.api.app import Server

    model_args, engine_config, config = serve_configs(args)
    groups = tensor_parallel_groups(args)
    if groups is not None:
        from pace_core.server.launch.tensor_parallel import tensor_parallel_server

        return tensor_parallel_server(model_args, groups, engine_config, config)
    plans = instance_plans(args)
    if plans is not None:
        return Server.multi_instance(model_args, plans, engine_config, config)
    from pace_core.engine.llm import LLMModel
    from pace_core.server.launch.threads import on_transient_thread

    llm = on_transient_thread(lambda: LLMModel(**model_args, quiet=True))
    return Server.in_process(llm, engine_config, config)


def tensor_parallel_groups(args: argparse.Namespace) -> list[tuple[InstancePlan, ...]] | None:
    """The rank plans of each tensor-parallel group (``--tensor-parallel N`` > 1), else None."""
    size = getattr(args, "tensor_parallel", 1)
    if size == 1:
        return None
    from pace_core.platform import current_topology
    from pace_core.server.launch.tensor_parallel import plan_groups

    return plan_groups(current_topology(), size, args.instances, args.instance_cores)


def instance_plans(args: argparse.Namespace) -> list[InstancePlan] | None:
    """The engine processes ``--instances`` / ``--instance-cores`` ask for (launch plans on
    this machine's topology); None: one engine thread in this process (``--instances 1``,
    or ``auto`` on a one-node machine)."""
    from pace_core.platform import current_topology
    from pace_core.platform.placement import plan_instances

    cores = getattr(args, "instance_cores", None)
    if args.instances == 1 and not cores:
        return None
    plans = plan_instances(current_topology(), args.instances, cores)
    return plans if len(plans) > 1 or cores else None


def serve_configs(args: argparse.Namespace) -> tuple[dict[str, Any], Any, Any]:
    """(LLMModel keyword arguments, EngineConfig, ServerConfig) of parsed ``serve`` args."""
    from pace_core import zoo
    from pace_core.engine.config import EngineConfig
    from pace_core.errors import ConfigError
    from pace_core.server.api.app import ServerConfig

    model = args.model or zoo.DEFAULT_MODEL
    if args.kv_cache_type not in ("paged", "slab_pool"):
        from pace_core.plugins import get_host

        spec = get_host().caches.get(args.kv_cache_type)
        if spec is None or spec.layout == "contiguous":
            raise ConfigError(
                f"--kv-cache-type {args.kv_cache_type!r} cannot serve: continuous batching needs "
                "a block cache (paged or slab_pool)"
            )
    name = args.served_model_name or os.path.basename(str(model).rstrip("/")) or str(model)
    engine_config = EngineConfig(
        max_running=args.max_running,
        max_queue=args.max_queue,
        max_prefill_tokens=args.max_prefill_tokens,
        prefill_slice_ms=args.prefill_slice_ms,
        mixed_steps=args.mixed_steps,
        prefix_caching=args.prefix_caching,
        threads=args.threads,
    )
    config = ServerConfig(
        served_model_name=name,
        aliases=tuple(a for a in {str(model)} if a != name),
        api_key=args.api_key or None,
        max_request_bytes=args.max_request_bytes,
        request_timeout=args.request_timeout or None,
        default_max_tokens=args.default_max_tokens,
        ui=args.ui,
    )
    spec_config = getattr(args, "spec_config", None)
    model_args = {
        "model": model,
        "dtype": args.dtype,
        "kv_cache_type": args.kv_cache_type,
        "kv_cache_memory_gb": args.kv_cache_memory_gb,
        "kv_cache_dtype": args.kv_cache_dtype,
        "max_cache_tokens": args.max_cache_tokens,
        "opconfig": args.opconfig,
        "spec_config": spec_config,
        "quantization": args.quantization,
    }
    if args.prefix_cache_dir:
        if not args.prefix_caching:
            raise ConfigError("--prefix-cache-dir needs prefix caching: drop --no-prefix-caching")
        model_args["prefix_cache_dir"] = args.prefix_cache_dir
        model_args["prefix_cache_disk_gb"] = args.prefix_cache_disk_gb
    if spec_config is not None and "model_name_or_path" in spec_config:
        # resolve (and pull) the draft before the target loads, and once for all instances
        # (an instance that cannot load it would die and be restarted forever)
        model_args["spec_config"] = {
            **spec_config,
            "model_name_or_path": str(_resolve_draft(spec_config["model_name_or_path"])),
        }
    return model_args, engine_config, config


def _resolve_draft(name: str) -> Path:
    from pace_core.errors import ConfigError, ModelLoadError
    from pace_core.models.loader import resolve_model_path

    try:
        return resolve_model_path(name)
    except ModelLoadError as exc:
        raise ConfigError(f"--spec-config model_name_or_path: {exc}") from None


def run_serve(args: argparse.Namespace) -> int:
    from pace_core.server.api.app import create_app
    from pace_core.server.launch.process import serve_http

    level = str(getattr(args, "log_level", None) or "info").lower()
    if not logging.getLogger().handlers:
        logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.ray and args.tensor_parallel > 1:
        from pace_core.errors import ConfigError

        raise ConfigError("--tensor-parallel with --ray is not supported: serve without --ray")
    if args.ray or args.tensor_parallel > 1 or instance_plans(args) is not None:
        from pace_core import zoo

        if args.model is None or zoo.is_zoo_name(args.model):
            args.model = str(zoo.pull(args.model or zoo.DEFAULT_MODEL))
    if args.ray:
        from pace_core.server.launch.ray_cli import run_ray

        return run_ray(args, *serve_configs(args))
    server = build_server(args)
    app = create_app(server)
    spec = args.spec_config
    spec_note = "" if spec is None else f", speculative {json.dumps(spec, separators=(',', ':'))}"
    print(
        f"pace serve: {server.config.served_model_name} on http://{args.host}:{args.port}/v1 "
        f"({len(server.frontend.instances)} instance(s), kv {args.kv_cache_type}{spec_note})",
        file=sys.stderr,
        flush=True,
    )
    return serve_http(app, server.frontend, args.host, args.port, level)
