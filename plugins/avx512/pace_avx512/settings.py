"""How quantized weights take bf16 activations: ``PACE_QUANT_ACTIVATIONS``, read when a model's
weights are packed (so each model keeps the choice it was loaded with).

- ``exact`` (default): activations quantized per group of 32 to 15 bits, two int8 planes (two
  ``vpdpbusd`` per k-quad; the avx2 build's calls of 2 rows or more: int16 words, one
  ``vpmaddwd`` per 16 products), or, for calls of 16 rows or more on AVX512-BF16 CPUs (on the
  avx2 build q6_k's calls of 256 rows or more), bf16 panels of the de-quantized weights: ~3e-5
  relative to the de-quantized matmul. SmolLM2's Q4_1 GGUF in bf16 against transformers fp32
  on the same file: KLD 0.002, top-1 97.7%.
- ``int8``: quantized to int8 per group of 32 (``amax / 127``), as llama.cpp does: one
  ``vpdpbusd`` per quad. On Zen 4: prefill 1.04-1.31x pace's dense bf16 prefill (``exact``
  0.91-1.03x), batch-8 decode 1.4-1.8x ``exact``, single-stream decode the same (bound by the
  weight stream). On Zen 3 (the avx2 build, no VNNI: vpmaddubsw forms) ~1.8x ``exact``'s
  decode GEMV rate and ~2.2x its prefill GEMM rate.
  Error of llama.cpp's class: KLD 0.010 / top-1 94.9% on the same file (llama.cpp 0.008 /
  95.2%); Gemma-3's Q4_K_M 0.025 (``exact`` 0.007, llama.cpp 0.031).

Every call of the model follows the choice, whatever its row count: a row's quantized matmuls
give the same bits alone or batched (decode, batched decode, speculative verification and
prefill chunks agree; ``exact`` switches to bf16 panels from 16 rows; on avx2 only q6_k does,
from 256). fp32 rows
always take the 15-bit activations: an fp32 model asks for fp32 precision (int8's error per
group is of the order of bf16's own rounding), and ``pace check`` holds it to transformers'
greedy tokens.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pace_core.errors import ConfigError

ENV_VAR = "PACE_QUANT_ACTIVATIONS"
CHOICES = ("exact", "int8")
DEFAULT = "exact"


def quant_activations(env: Mapping[str, str] = os.environ) -> str:
    """The chosen mode (``exact`` or ``int8``); a bad value raises :class:`ConfigError`."""
    value = env.get(ENV_VAR, "").strip().lower() or DEFAULT
    if value not in CHOICES:
        raise ConfigError(
            f"{ENV_VAR}={env[ENV_VAR]!r} is not a choice; set it to one of "
            f"{', '.join(CHOICES)} (default {DEFAULT}), or unset it"
        )
    return value


def int8_activations(env: Mapping[str, str] = os.environ) -> bool:
    """Whether weights packed now take int8 activations."""
    return quant_activations(env) == "int8"
