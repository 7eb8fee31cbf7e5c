"""The ``pace`` command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

import torch

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def _cmd_plugins(args: argparse.Namespace) -> int:
    from pace_core.plugins import get_host
    from pace_core.report import plugins_table

    print(plugins_table(get_host()))
    return 0


def _cmd_ops(args: argparse.Namespace) -> int:
    from pace_core.cpu import detect_cpu
    from pace_core.opconfig import OperatorConfig
    from pace_core.plugins import get_host
    from pace_core.report import ops_table

    config = OperatorConfig.coerce(args.opconfig)
    print(ops_table(get_host(), config, detect_cpu(), DTYPES[args.dtype]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pace", description=__doc__)
    parser.add_argument("--log-level", default=os.environ.get("PACE_LOG_LEVEL", "warning"),
                        choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plugins", help="list installed plugins and what they provide")
    p.set_defaults(func=_cmd_plugins)

    p = sub.add_parser("ops", help="show each op's kernel candidates and the chosen backend")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--opconfig", default=None, help="e.g. 'linear=avx512,norm=native' or JSON")
    p.set_defaults(func=_cmd_ops)
    return parser


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
