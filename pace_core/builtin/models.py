"""Built-in plugin: registers the model families shipped with pace.

Family modules are imported when a model of that type is built, not at start-up.
"""

from __future__ import annotations

import importlib
from typing import Any

from pace_core.hookspecs import hookimpl
from pace_core.registry import Registrations

PACE_CONTRACT_VERSION = 1  # the pace_core.CONTRACT_VERSION this plugin implements

# model_type -> (module under pace_core.models.families, builder function, description)
FAMILIES: dict[str, tuple[str, str, str]] = {
    "llama": ("llama", "build", "Llama 1-3.3, SmolLM2 (rope scaling incl. llama3)"),
    "qwen2": ("qwen2", "build", "Qwen2 / Qwen2.5 (qkv bias, sliding window)"),
    "qwen3": ("qwen3", "build", "Qwen3 dense (QK-norm, sliding window)"),
    "qwen3_moe": ("qwen3_moe", "build", "Qwen3-MoE (QK-norm, top-k routed SwiGLU experts)"),
    "mistral": ("mistral", "build", "Mistral (sliding window on every layer)"),
    "smollm3": ("smollm3", "build", "SmolLM3 (NoPE every 4th layer)"),
    "phi3": ("phi3", "build", "Phi-3 / Phi-4 (fused qkv and gate_up, longrope)"),
    "opt": ("opt", "build", "OPT (learned positions, pre- or post-norm)"),
    "gptj": ("gptj", "build", "GPT-J (parallel block, interleaved partial rotary)"),
    "gemma3_text": ("gemma3", "build", "Gemma 3 text (QK-norm, sandwich norms, local/global)"),
    "gemma3": ("gemma3", "build_conditional", "Gemma 3 ConditionalGeneration: text part"),
    "llama4_text": ("llama4", "build", "Llama 4 text (MoE + shared expert, chunked attention)"),
    "llama4": ("llama4", "build_conditional", "Llama 4 ConditionalGeneration: text part"),
    "deepseek_v3": ("deepseek_v3", "build", "DeepSeek-V3 / R1 (latent attention + cache, MoE)"),
    "gemma4_text": ("gemma4", "build", "Gemma 4 text (per-layer inputs, KV sharing, MoE)"),
    "gemma4": ("gemma4", "build_conditional", "Gemma 4 ConditionalGeneration: text part"),
    "gpt_oss": ("gpt_oss", "build", "GPT-OSS (MoE, attention sinks, MXFP4 experts)"),
}


class LazyBuilder:
    """Imports the family module on first call; carries the module's ``harmless_extras``."""

    def __init__(self, module: str, function: str) -> None:
        self.module, self.function = module, function

    def _target(self) -> Any:
        mod = importlib.import_module(f"pace_core.models.families.{self.module}")
        return getattr(mod, self.function)

    @property
    def harmless_extras(self) -> tuple[str, ...]:
        return tuple(getattr(self._target(), "harmless_extras", ()))

    def __call__(self, builder: Any) -> Any:
        return self._target()(builder)


@hookimpl
def pace_register_models(registry: Registrations) -> None:
    for model_type, (module, function, description) in FAMILIES.items():
        registry.add_model(model_type, LazyBuilder(module, function), description)
