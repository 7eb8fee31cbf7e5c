"""pace: a CPU-first LLM inference engine for PyTorch with pluggable kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pace_core.hookspecs import hookimpl
from pace_core.opconfig import OperatorConfig

__version__ = "0.1.0"


def _configure_logging() -> None:
    """Honour ``PACE_LOG_LEVEL`` (debug, info, warning, error) for the ``pace`` loggers."""
    import logging
    import os

    level = os.environ.get("PACE_LOG_LEVEL")
    if level:
        logging.getLogger("pace").setLevel(level.upper())


_configure_logging()

__all__ = ["LLMModel", "OperatorConfig", "SamplingConfig", "__version__", "hookimpl"]

if TYPE_CHECKING:
    from pace_core.engine.llm import LLMModel
    from pace_core.sampling.config import SamplingConfig


def __getattr__(name: str) -> Any:
    # The engine pulls in transformers; load it only when asked for.
    if name == "LLMModel":
        from pace_core.engine.llm import LLMModel

        return LLMModel
    if name == "SamplingConfig":
        from pace_core.sampling.config import SamplingConfig

        return SamplingConfig
    raise AttributeError(f"module 'pace_core' has no attribute {name!r}")
