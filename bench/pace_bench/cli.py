"""``pace bench``: run a benchmark, write its results folder, draw its plots.

    pace bench kernels --threads 1 --dtypes bfloat16      # one benchmark
    pace bench all --quick                                # every benchmark, small settings
    pace bench plot results/20260101T120000Z-kernels      # redraw plots from the JSON

A run writes ``results/<UTC timestamp>-<name>/`` (or ``--out DIR``) holding ``machine.json``,
``<name>.json`` (the payload: machine, arguments, result rows) and PNG plots. Tables go to
stdout and progress bars to stderr; ``--quiet`` prints neither.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

BENCHMARKS = (
    "offline", "batch", "decode_vs_peers", "kernels", "attention", "serving", "one_user",
    "speculative", "quality", "loading", "quantized", "structured", "prefix", "embeddings",
    "scoring", "compile", "dlrm", "tensor_parallel", "scaling",
)  # fmt: skip
RESULTS_ROOT = Path("results")


def benchmark_module(name: str) -> ModuleType:
    """``pace_bench.<name>``: exposes ``add_arguments``, ``run``, ``main`` and ``QUICK``."""
    return importlib.import_module(f"pace_bench.{name}")


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default: results/<UTC timestamp>-<name>)",
    )
    p.add_argument("--quiet", action="store_true", help="no tables and no progress bars")
    p.add_argument("--json", action="store_true", help="also print the JSON payload to stdout")
    p.add_argument("--no-plots", action="store_true", help="write the JSON only")


def _describe(module: ModuleType) -> str:
    return (module.__doc__ or "").strip().splitlines()[0]


class _BenchParser(argparse.ArgumentParser):
    """A benchmark's parser: with ``--quick`` among its arguments, ``quick_defaults`` become
    the defaults for that parse, so options given explicitly still win."""

    quick_defaults: Mapping[str, Any] = MappingProxyType({})  # set per benchmark parser

    def parse_known_args(
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if not self.quick_defaults or args is None or "--quick" not in args:
            return super().parse_known_args(args, namespace)
        saved = {dest: self.get_default(dest) for dest in self.quick_defaults}
        self.set_defaults(**self.quick_defaults)
        try:
            return super().parse_known_args(args, namespace)
        finally:
            self.set_defaults(**saved)


def add_bench_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``pace bench`` (with one subcommand per benchmark, ``all`` and ``plot``)."""
    p = sub.add_parser(
        "bench",
        help="benchmarks: JSON + tables + plots in a results folder",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    names = p.add_subparsers(dest="bench", required=True, parser_class=_BenchParser)
    for name in BENCHMARKS:
        try:
            module = benchmark_module(name)
        except Exception as exc:  # a broken benchmark must not break every `pace` command
            names.add_parser(name, help=f"cannot be loaded: {type(exc).__name__}: {exc}")
            continue
        q = names.add_parser(
            name,
            help=_describe(module),
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        q.quick_defaults = dict(module.QUICK)
        module.add_arguments(q)
        q.add_argument(
            "--quick",
            action="store_true",
            help="small settings: " + " ".join(f"{k}={v}" for k, v in module.QUICK.items()),
        )
        _add_output_arguments(q)
    q = names.add_parser("all", help="every benchmark into one folder")
    q.add_argument("--quick", action="store_true", help="small settings of every benchmark")
    q.add_argument("--skip", nargs="+", default=[], choices=BENCHMARKS, metavar="NAME")
    _add_output_arguments(q)
    q = names.add_parser("plot", help="redraw the plots of a results folder from its JSON")
    q.add_argument("folder", type=Path)
    q.add_argument("--out", type=Path, default=None, help="where to write (default: the folder)")
    q.add_argument("--quiet", action="store_true")
    p.set_defaults(func=execute)
    return p


def build_parser() -> argparse.ArgumentParser:
    """A parser whose only command is ``bench`` (for ``main_for`` and the shims)."""
    parser = argparse.ArgumentParser(prog="pace")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse ``["bench", name, ...]``."""
    return build_parser().parse_args(argv)


def default_out(name: str) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return RESULTS_ROOT / f"{stamp}-{name}"


def _say(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(message, flush=True)


def save(payload: dict[str, Any], out: Path, args: argparse.Namespace) -> list[Path]:
    """Write the JSON files and (unless ``--no-plots``) the plots; return what was written."""
    from pace_bench import plots
    from pace_bench.common import write_results

    written = write_results(out, payload)
    if not getattr(args, "no_plots", False):
        try:
            written += plots.make_plots(payload, out)
        except plots.PlotsUnavailable as exc:
            print(f"pace bench: {exc}", file=sys.stderr)
    return written


def run_benchmark(name: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Run one benchmark with parsed ``args`` and write its results into ``out``."""
    from pace_bench.common import machine_info

    args.machine = machine_info()  # before the run: load average, affinity
    payload = benchmark_module(name).run(args)
    written = save(payload, out, args)
    _say(args, f"{name}: wrote {', '.join(str(p) for p in written)}")
    if args.json:
        print(json.dumps(payload, indent=2))
    return payload


def _run_all(args: argparse.Namespace) -> int:
    out = args.out or default_out("all")
    failed = []
    for name in BENCHMARKS:
        if name in args.skip:
            continue
        flags = {"--quick": args.quick, "--quiet": args.quiet, "--no-plots": args.no_plots}
        argv = ["bench", name, "--out", str(out), *(flag for flag, on in flags.items() if on)]
        try:
            run_benchmark(name, parse(argv), out)
        except Exception as exc:  # one broken benchmark must not lose the others' results
            failed.append(name)
            print(f"pace bench all: {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    _say(args, f"results: {out}" + (f" (failed: {', '.join(failed)})" if failed else ""))
    return 1 if failed else 0


def _plot(args: argparse.Namespace) -> int:
    from pace_bench import plots
    from pace_bench.common import read_results

    payloads = read_results(args.folder)
    if not payloads:
        print(f"pace bench plot: no benchmark JSON in {args.folder}", file=sys.stderr)
        return 2
    out = args.out or args.folder
    try:
        written = [path for payload in payloads for path in plots.make_plots(payload, out)]
    except plots.PlotsUnavailable as exc:
        print(f"pace bench plot: {exc}", file=sys.stderr)
        return 1
    _say(args, "\n".join(str(p) for p in written) or "nothing to plot")
    return 0


def execute(args: argparse.Namespace) -> int:
    """``pace bench ...`` once parsed."""
    if args.bench == "plot":
        return _plot(args)
    if args.bench == "all":
        return _run_all(args)
    run_benchmark(args.bench, args, args.out or default_out(args.bench))
    return 0


def main_for(name: str, argv: list[str] | None = None) -> dict[str, Any]:
    """``pace bench <name> [argv]`` (argv defaults to ``sys.argv[1:]``); returns the payload."""
    from pace_core.errors import PaceError

    args = parse(["bench", name, *(sys.argv[1:] if argv is None else argv)])
    try:
        return run_benchmark(name, args, args.out or default_out(name))
    except PaceError as exc:
        raise SystemExit(f"pace bench {name}: error: {exc}") from None
