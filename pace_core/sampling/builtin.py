"""Registration of the built-in logits processors (wrapped by the core's plugin hook)."""

from __future__ import annotations

from typing import Any

from pace_core.sampling.processors import BUILTIN_PROCESSORS

__all__ = ["register_builtin_processors"]


def register_builtin_processors(registry: Any) -> None:
    """Call ``registry.add_processor(name, factory, order=...)`` for every built-in.

    ``registry`` is a ``pace_core.registry.Registrations`` (or anything with that method).
    """
    for name, order, factory in BUILTIN_PROCESSORS:
        registry.add_processor(name, factory, order=order)
