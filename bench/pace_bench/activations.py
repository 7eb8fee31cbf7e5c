"""pace-avx512's quantized-activation modes (``PACE_QUANT_ACTIVATIONS``) as bench engines.

A benchmark that takes ``--activations exact int8`` loads each quantized model once per mode
and names its rows ``pace`` (``exact``, the default) or ``pace-a8`` (``int8``, llama.cpp's
precision). The mode is read when a model's weights are packed, so models loaded under
different modes coexist in one process.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
from collections.abc import Iterator

import torch

from pace_bench.common import note

ENV_VAR = "PACE_QUANT_ACTIVATIONS"  # pace_avx512.settings.ENV_VAR
ENGINES = {"exact": "pace", "int8": "pace-a8"}
"""Mode -> the engine name of its rows."""


def add_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--activations", nargs="+", default=["exact"], choices=list(ENGINES),
                   help="pace-avx512's PACE_QUANT_ACTIVATIONS modes to run quantized weights "
                   "in (int8: engine pace-a8)")  # fmt: skip


def modes(args: argparse.Namespace) -> list[str]:
    """The ``--activations`` this machine can run (int8 needs pace-avx512; noted if dropped)."""
    chosen = list(args.activations)
    if "int8" in chosen and importlib.util.find_spec("pace_avx512") is None:
        note(args, "pace-a8 skipped: int8 activations are pace-avx512's (not installed)")
        chosen.remove("int8")
    return chosen


def for_model(modes: list[str], *, quantized: bool, dtype: torch.dtype) -> list[str]:
    """The modes that differ for a model: all for quantized weights in bf16; else ``exact``
    alone (dense weights have no activation mode, fp32 rows take 15 bits in every mode)."""
    return modes if quantized and dtype == torch.bfloat16 else ["exact"]


@contextlib.contextmanager
def loaded_under(mode: str) -> Iterator[None]:
    """Models loaded inside take quantized activations ``mode``; the environment is restored."""
    before = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = mode
    try:
        yield
    finally:
        if before is None:
            del os.environ[ENV_VAR]
        else:
            os.environ[ENV_VAR] = before
