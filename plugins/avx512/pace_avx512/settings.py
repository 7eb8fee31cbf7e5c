"""Process-wide numerics of the quantized kernels, chosen in the environment.

``PACE_QUANT_ACTIVATIONS`` says how a matmul over quantized weights takes bf16 activations:

- ``int8`` (default): quantized to int8 per group of 32 (``amax / 127``), as llama.cpp does:
  one ``vpdpbusd`` per k-quad. Against ``exact`` on Zen 4: prefill 1.2-1.3x (1.05-1.27x pace's
  dense bf16 prefill), batch-8 decode ~1.9x, single-stream decode the same (bound by the
  weight stream). Error of llama.cpp's class: KLD ~0.010 against transformers fp32 on
  SmolLM2's Q4_1 GGUF (llama.cpp 0.008; ``exact`` 0.002).
- ``exact``: 15-bit activations split into two int8 planes (two ``vpdpbusd`` per quad), or,
  for calls of 16 rows or more on AVX512-BF16 CPUs, bf16 panels of the de-quantized weights:
  ~3e-5 relative to the de-quantized matmul.

Every call of a bf16 model follows the choice, whatever its row count, so a sequence computes
the same numbers alone or batched, and speculative verification matches plain decoding. fp32
models always take the 15-bit activations: they ask for fp32 precision (int8's error per group
is of the order of bf16's own rounding), and ``pace check`` holds them to transformers' greedy
tokens.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import ModuleType

from pace_core.errors import ConfigError

ENV_VAR = "PACE_QUANT_ACTIVATIONS"
CHOICES = {"int8": 1, "exact": 0}
"""Mode -> the kernels' ``int8_activation_rows`` (rows from which a bf16 call takes int8; 0
never), ``csrc/kernels.h`` Tuning."""
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
