"""The ``pace`` command line."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from pace_core.arg_types import at_least
from pace_core.caches.kv_quant import add_kv_cache_dtype_argument
from pace_core.quant.config import add_quantization_argument

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def _cmd_plugins(args: argparse.Namespace) -> int:
    from pace_core.platform import current_topology
    from pace_core.plugins import get_host
    from pace_core.report import plugins_table

    print(plugins_table(get_host()))
    print(current_topology().summary())
    return 0


def _cmd_ops(args: argparse.Namespace) -> int:
    from pace_core.cpu import detect_cpu
    from pace_core.opconfig import OperatorConfig
    from pace_core.plugins import get_host
    from pace_core.report import ops_table

    config = OperatorConfig.coerce(args.opconfig)
    print(ops_table(get_host(), config, detect_cpu(), DTYPES[args.dtype]))
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from pace_core import zoo
    from pace_core.errors import ConfigError

    unused = _unused_models_options(args)
    if unused:
        raise ConfigError(f"pace models {args.action} does not take {'; '.join(unused)}")
    if args.action == "pull":
        for name in args.names or [zoo.DEFAULT_MODEL]:
            print(zoo.pull(name, force=args.force, quiet=args.quiet))
        return 0
    if args.action == "quantize":
        return _quantize_model(args)
    for m in zoo.list_models():
        state = "prepared" if zoo.is_prepared(m.name) else "not prepared"
        print(f"{m.name:14s} {state:13s} {m.description}")
    return 0


def _unused_models_options(args: argparse.Namespace) -> list[str]:
    """The options given to ``pace models <action>`` that the action does not take, each with
    the actions that do."""
    options = (
        ("--quantization", args.quantization is not None, ("quantize",)),
        ("--dtype", args.dtype is not None, ("quantize",)),
        ("--force", args.force, ("pull",)),
        ("model names", bool(args.names), ("pull", "quantize")),
    )
    return [
        f"{name} (only {' and '.join(actions)})"
        for name, given, actions in options
        if given and args.action not in actions
    ]


def _quantize_model(args: argparse.Namespace) -> int:
    from pace_core.models.quantized_copy import save_quantized

    if len(args.names) != 2 or not args.quantization:
        print("usage: pace models quantize SOURCE OUT --quantization PRESET", file=sys.stderr)
        return 2
    source, out = args.names
    print(save_quantized(source, out, args.quantization, DTYPES[args.dtype or "bfloat16"]))
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from pace_core import zoo
    from pace_core.engine.llm import LLMModel

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model = LLMModel(
        args.model or zoo.DEFAULT_MODEL,
        dtype=DTYPES[args.dtype],
        opconfig=args.opconfig,
        profile=args.profile or None,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    overrides = {"max_new_tokens": args.max_new_tokens}
    if args.temperature is not None:
        overrides.update(do_sample=args.temperature > 0, temperature=args.temperature or 1.0)
    if args.seed is not None:
        overrides["seed"] = args.seed
    config = model.sampling_defaults(**overrides)
    prompt = args.prompt
    if args.chat:
        prompt = [{"role": "user", "content": args.prompt}]
    if args.show_plan:
        print(model.op_plan, file=sys.stderr)
    if not args.chat:
        print(args.prompt, end="", flush=True)
    start = time.perf_counter()
    count = 0
    try:
        for chunk in model.stream(prompt, config):
            print(chunk.text, end="", flush=True)
            count += 1
    finally:
        print()  # ends the echoed text, before any error message
    wall = time.perf_counter() - start
    if args.profile:
        print(f"\n{count} tokens in {wall:.2f} s ({count / wall:.1f} tok/s)", file=sys.stderr)
        print(model.profiler.report(wall), file=sys.stderr)
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from pace_core import zoo
    from pace_core.check import check_plans, check_quantized, format_rows, run_check
    from pace_core.errors import ConfigError
    from pace_core.models.loader import resolve_model_path
    from pace_core.platform import current_topology

    if args.quantization and args.new_tokens is not None:
        raise ConfigError(
            "--new-tokens sets the greedy token comparison; with --quantization pace check "
            "compares logits over the quality text instead: drop one of them"
        )
    plans = check_plans(args.plans)  # a bad backend fails before the reference loads
    path = resolve_model_path(args.model or zoo.DEFAULT_MODEL)
    if args.quantization:
        rows = check_quantized(str(path), args.quantization, plans=plans)
    else:
        rows = run_check(str(path), new_tokens=args.new_tokens or 24, plans=plans)
    print(format_rows(rows))
    print(current_topology().summary())
    return 0 if all(r.passed for r in rows) else 1


def _cmd_build_kernels(args: argparse.Namespace) -> int:
    from pace_core.builds import outcomes_table, run_builds
    from pace_core.plugins import get_host

    outcomes = run_builds(get_host(), args.backends or None)
    print(outcomes_table(outcomes))
    return 1 if any(o.status == "failed" for o in outcomes) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pace", description=__doc__)
    parser.add_argument(
        "--log-level",
        default=os.environ.get("PACE_LOG_LEVEL", "warning"),
        choices=["debug", "info", "warning", "error"],
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plugins", help="list installed plugins and what they provide")
    p.set_defaults(func=_cmd_plugins)

    p = sub.add_parser("ops", help="show each op's kernel candidates and the chosen backend")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--opconfig", default=None, help="e.g. 'linear=avx512,norm=native' or JSON")
    p.set_defaults(func=_cmd_ops)

    p = sub.add_parser(
        "models",
        help="list or prepare the bundled real models; save a quantized copy of a model",
        description="pace models [list] | pull [NAME...] | quantize SOURCE OUT --quantization P",
    )
    p.add_argument("action", choices=["list", "pull", "quantize"], nargs="?", default="list")
    p.add_argument("names", nargs="*", help="zoo model names (quantize: SOURCE and OUT)")
    p.add_argument("--force", action="store_true", help="re-convert even if prepared")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES),
                   help="quantize: what weights de-quantize to (default bfloat16)")  # fmt: skip
    add_quantization_argument(p)
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("generate", help="generate text (default model: SmolLM2-135M-Instruct)")
    p.add_argument("prompt")
    p.add_argument("--model", default=None, help="directory, GGUF file, zoo name or hub id")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--max-new-tokens", type=at_least(1), default=64)
    p.add_argument("--temperature", type=at_least(0, float), default=None, help="0 = greedy")
    p.add_argument("--seed", type=at_least(0), default=None)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    p.add_argument("--threads", type=at_least(1), default=None)
    p.add_argument("--opconfig", default=None, help="e.g. 'linear=avx512,norm=native' or JSON")
    p.add_argument("--show-plan", action="store_true", help="print the op plan to stderr")
    p.add_argument("--profile", action="store_true", help="time every op; print a table")
    add_quantization_argument(p)
    add_kv_cache_dtype_argument(p)
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("build-kernels", help="build JIT kernels now (and retry failed builds)")
    p.add_argument("backends", nargs="*", help="backends to build (default: every one offered)")
    p.set_defaults(func=_cmd_build_kernels)

    p = sub.add_parser("check", help="compare pace with transformers on a model (pass/fail)")
    p.add_argument(
        "model", nargs="?", default=None, help="directory, GGUF file, zoo name or hub id"
    )
    p.add_argument(
        "--new-tokens",
        type=at_least(1),
        default=None,
        help="greedy tokens compared per prompt (default 24; not with --quantization, which "
        "compares logits over the quality text)",
    )
    p.add_argument(
        "--plans",
        nargs="+",
        default=["native", "auto"],
        help="backend plans: a backend for every op (native, auto, avx512, ...) or an "
        "OperatorConfig string (linear=avx512,default=native)",
    )
    add_quantization_argument(p)
    p.set_defaults(func=_cmd_check)

    from pace_core.dlrm.cli import add_dlrm_parser
    from pace_core.server.launch.cli import add_serve_parser

    add_dlrm_parser(sub)
    add_serve_parser(sub)
    add_command_plugins(sub)
    return parser


COMMAND_GROUP = "pace.commands"
"""Entry points of other distributions that add ``pace`` subcommands (``pace-bench``: ``bench``);
each is a function taking the subparsers object."""


def add_command_plugins(sub: Any) -> None:
    """Add the subcommands other installed distributions declare; ``pace bench`` without
    ``pace-bench`` installed says how to get it."""
    added = set()
    for ep in importlib.metadata.entry_points(group=COMMAND_GROUP):
        try:
            ep.load()(sub)
        except Exception as exc:  # a broken distribution must not take `pace` down with it
            logging.getLogger("pace.cli").warning(
                "command %r of %s could not be added: %s: %s",
                ep.name, ep.value, type(exc).__name__, exc,
            )  # fmt: skip
            continue
        added.add(ep.name)
    if "bench" not in added and "bench" not in sub.choices:  # (a broken one stays, logged)
        p = sub.add_parser("bench", help="benchmarks (needs the pace-bench distribution)")
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=_cmd_bench_missing)


def _cmd_bench_missing(args: argparse.Namespace) -> int:
    print(
        "pace: error: `pace bench` is in the pace-bench distribution, which is not installed: "
        "`pip install pace-bench` (from the repository: `pip install -e bench`)",
        file=sys.stderr,
    )
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    from pace_core.errors import PaceError

    try:
        return args.func(args)
    except PaceError as exc:
        print(f"pace: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
