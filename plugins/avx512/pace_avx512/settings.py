"""Process-wide numerics of the quantized kernels, chosen in the environment.

``PACE_QUANT_ACTIVATIONS`` says how a quantized matmul of many bf16 activation rows (a prefill
chunk, a large batch: at least :data:`INT8_FROM_ROWS` rows) takes its activations:

- ``int8`` (default): quantized to int8 per group of 32 (``amax / 127``), as llama.cpp does
  for every call: one ``vpdpbusd`` per k-quad, 1.2-1.4x the dense bf16 GEMM rate on Zen 4,
  llama.cpp-class error (KLD ~0.008-0.010 against transformers fp32 on SmolLM2's GGUF).
- ``exact``: the 15-bit split activations, or, for bf16 on AVX512-BF16 CPUs, bf16 panels of
  the de-quantized weights: ~3e-5 relative to the de-quantized matmul (KLD ~0.002), at
  0.95-0.98x the dense bf16 prefill rate.

Calls of fewer rows (decode, batched decode, speculative verification) always run the 15-bit
activations: they are bound by the weight stream, which int8 would not shorten. So do fp32
models, which ask for fp32 precision (int8's error per group is of the order of bf16's own
rounding): ``pace check`` holds them to transformers' greedy tokens.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import ModuleType

from pace_core.errors import ConfigError

ENV_VAR = "PACE_QUANT_ACTIVATIONS"
INT8_FROM_ROWS = 16
"""Rows from which ``int8`` applies (``csrc/kernels.h`` Tuning::int8_activation_rows)."""
CHOICES = {"int8": INT8_FROM_ROWS, "exact": 0}
DEFAULT = "int8"


def quant_activations(env: Mapping[str, str] = os.environ) -> str:
    """The chosen mode (``int8`` or ``exact``); a bad value raises :class:`ConfigError`."""
    value = env.get(ENV_VAR, "").strip().lower() or DEFAULT
    if value not in CHOICES:
        raise ConfigError(
            f"{ENV_VAR}={env[ENV_VAR]!r} is not a choice; set it to one of "
            f"{', '.join(CHOICES)} (default {DEFAULT}), or unset it"
        )
    return value


def apply(module: ModuleType, env: Mapping[str, str] = os.environ) -> None:
    """Set the loaded kernels' int8-activation threshold from the environment."""
    module.set_int8_activation_rows(CHOICES[quant_activations(env)])
