"""Built-in plugin: registers pace's logits processors (penalties, temperature, top-k/p, …)."""

from __future__ import annotations

from pace_core.hookspecs import hookimpl
from pace_core.registry import SamplerRegistry
from pace_core.sampling.builtin import register_builtin_processors


@hookimpl
def pace_register_samplers(registry: SamplerRegistry) -> None:
    register_builtin_processors(registry)
