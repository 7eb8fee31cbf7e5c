"""The engine core's scheduler knobs."""

from __future__ import annotations

from dataclasses import dataclass

from pace_core.engine.prefill_budget import PrefillBudget
from pace_core.errors import ConfigError


@dataclass
class EngineConfig:
    """Scheduler knobs of one engine instance."""

    max_running: int = 32
    max_queue: int = 256
    max_prefill_tokens: int = 512
    prefill_slice_ms: float = 50.0  # prefill work per iteration while sequences decode
    mixed_steps: bool = True  # decodes and prompt chunks in one forward where the stack packs
    prefix_caching: bool = True  # reuse the KV of indexed full prompt blocks (--no-prefix-caching)
    # a prompt whose next block another prompt is prefilling waits to adopt it (throughput,
    # offline); served, it would hold the queue behind it for the other prompt's chunks
    wait_for_shared_prefix: bool = False
    threads: int | None = None  # torch intra-op threads of the engine thread

    def __post_init__(self) -> None:
        for name in ("max_running", "max_prefill_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.max_queue < 0:
            raise ConfigError(f"max_queue must be >= 0 (got {self.max_queue})")
        PrefillBudget(self.max_prefill_tokens, self.prefill_slice_ms)  # validates both
