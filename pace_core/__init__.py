"""pace: a CPU-first LLM inference engine for PyTorch with pluggable kernels.

The seed API is importable from here::

    from pace_core import (LLMModel, SamplingConfig, OperatorConfig, KVCacheType,
                           PardSpecDecodeConfig, DraftSpecDecodeConfig, PromptLookupConfig)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pace_core.caches import KVCacheType
from pace_core.hookspecs import hookimpl
from pace_core.opconfig import OperatorConfig
from pace_core.ops import CONTRACT_VERSION

__version__ = "0.1.0"


def _configure_logging() -> None:
    """Honour ``PACE_LOG_LEVEL`` (debug, info, warning, error) for the ``pace`` loggers."""
    import logging
    import os

    level = os.environ.get("PACE_LOG_LEVEL")
    if level:
        logging.getLogger("pace").setLevel(level.upper())


_configure_logging()

# Names loaded on first use: the engine pulls in transformers.
_LAZY = {
    "LLMModel": "pace_core.engine.llm",
    "SamplingConfig": "pace_core.sampling.config",
    "PardSpecDecodeConfig": "pace_core.speculative.config",
    "DraftSpecDecodeConfig": "pace_core.speculative.config",
    "PromptLookupConfig": "pace_core.speculative.config",
}

__all__ = [
    "CONTRACT_VERSION",
    "DraftSpecDecodeConfig",
    "KVCacheType",
    "LLMModel",
    "OperatorConfig",
    "PardSpecDecodeConfig",
    "PromptLookupConfig",
    "SamplingConfig",
    "__version__",
    "hookimpl",
]

if TYPE_CHECKING:
    from pace_core.engine.llm import LLMModel
    from pace_core.sampling.config import SamplingConfig
    from pace_core.speculative.config import (
        DraftSpecDecodeConfig,
        PardSpecDecodeConfig,
        PromptLookupConfig,
    )


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pace_core' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
