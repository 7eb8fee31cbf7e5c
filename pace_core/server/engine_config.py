"""An engine instance's scheduler knobs and the checks of what it serves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pace_core.errors import ConfigError
from pace_core.models.limits import serving_context_window
from pace_core.server.prefill_budget import PrefillBudget


@dataclass
class EngineConfig:
    """Scheduler knobs of one engine instance."""

    max_running: int = 32
    max_queue: int = 256
    max_prefill_tokens: int = 512
    prefill_slice_ms: float = 50.0  # prefill work per iteration while sequences decode
    mixed_steps: bool = True  # decodes and prompt chunks in one forward where the stack packs
    prefix_caching: bool = True  # reuse the KV of indexed full prompt blocks (--no-prefix-caching)
    threads: int | None = None  # torch intra-op threads of the engine thread

    def __post_init__(self) -> None:
        for name in ("max_running", "max_prefill_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.max_queue < 0:
            raise ConfigError(f"max_queue must be >= 0 (got {self.max_queue})")
        PrefillBudget(self.max_prefill_tokens, self.prefill_slice_ms)  # validates both


def check_block_cache(cache: Any, kv_cache_type: str) -> None:
    needed = ("free_sequence", "num_blocks", "block_size", "num_free_blocks", "adopt_prefix")
    if not all(hasattr(cache, n) for n in needed):
        raise ConfigError(
            f"kv_cache_type {kv_cache_type!r} cannot serve: continuous batching steps a changing "
            "subset of sequences, which needs a block cache; use 'paged' or 'slab_pool'"
        )


def engine_cache(llm: Any, config: EngineConfig) -> Any:
    """A new block cache of ``llm`` for an engine, prefix caching on unless turned off; its
    namespace names what else changes the KV (model, dtype, quantization)."""
    cache = llm.new_cache()
    check_block_cache(cache, getattr(llm, "kv_cache_type", "?"))
    if config.prefix_caching:
        cache.enable_prefix_caching(llm.kv_namespace)
    return cache


def context_window(llm: Any) -> int:
    """Tokens one sequence may hold (prompt + generated); see
    :func:`~pace_core.models.limits.serving_context_window`."""
    return serving_context_window(llm.model.config)
