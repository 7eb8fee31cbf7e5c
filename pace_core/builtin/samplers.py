"""Built-in plugin: registers pace's logits processors (penalties, temperature, top-k/p, …)."""

from __future__ import annotations

from pace_core.hookspecs import hookimpl
from pace_core.registry import Registrations
from pace_core.sampling.builtin import register_builtin_processors

PACE_CONTRACT_VERSION = 1  # the pace_core.CONTRACT_VERSION this plugin implements


@hookimpl
def pace_register_samplers(registry: Registrations) -> None:
    register_builtin_processors(registry)
