"""Sampling subsystem: per-request configs, batched logits processors, token selection, stops.

Pure torch and engine-agnostic; see the module docstrings for the semantics choices.
"""

from pace_core.sampling.builtin import register_builtin_processors
from pace_core.sampling.config import MAX_LOGPROBS, SamplingConfig
from pace_core.sampling.processors import (
    BUILTIN_PROCESSORS,
    LogitsProcessor,
    ProcessorFactory,
    build_processors,
)
from pace_core.sampling.sampler import (
    BatchSampler,
    StepResult,
    TokenLogprobs,
    compute_logprobs,
    make_generator,
    sample_from_logits,
)
from pace_core.sampling.state import TokenState
from pace_core.sampling.stop import StopChecker, StopUpdate, find_stop, holdback_length, is_eos

__all__ = [
    "BUILTIN_PROCESSORS",
    "MAX_LOGPROBS",
    "BatchSampler",
    "LogitsProcessor",
    "ProcessorFactory",
    "SamplingConfig",
    "StepResult",
    "StopChecker",
    "StopUpdate",
    "TokenLogprobs",
    "TokenState",
    "build_processors",
    "compute_logprobs",
    "find_stop",
    "holdback_length",
    "is_eos",
    "make_generator",
    "register_builtin_processors",
    "sample_from_logits",
]
