"""Built-in plugin: registers the model families shipped with pace."""

from __future__ import annotations

from pace_core.hookspecs import hookimpl
from pace_core.models.families import llama
from pace_core.registry import ModelRegistry


@hookimpl
def pace_register_models(registry: ModelRegistry) -> None:
    registry.add_model("llama", llama.build, "Llama 1-3.3, SmolLM2, Mistral-style")
