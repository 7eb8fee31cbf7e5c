"""A model's length limits and generation defaults, read in one place.

The offline engine (:class:`~pace_core.engine.llm.LLMModel`), the server (in-process and
multi-instance front doors alike), the speculative inferencers and the rotary tables all ask
this module, so the rules live here once:

* :func:`max_positions`: the HF config's ``max_position_embeddings`` (None when absent);
* :func:`longrope_original_max`: where a LongRoPE model switches to its long factors (read as
  :class:`~pace_core.models.rope.Rotary` reads it);
* :func:`serving_context_window`: tokens one served sequence may hold;
* :func:`read_generation_config`: ``generation_config.json`` as a dict.

Only builtins and the HF config object are used: the server's front door calls these on a
config loaded without the weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pace_core.errors import ConfigError

DEFAULT_CONTEXT = 4096  # the serving context window of a config without max_position_embeddings


def text_config(config: Any) -> Any:
    """The language model's config: ``config.text_config`` of a multimodal checkpoint (what
    the model builders use, e.g. Gemma 3), else ``config`` itself."""
    sub = getattr(config, "text_config", None)
    return config if sub is None else sub


def max_positions(config: Any) -> int | None:
    """The model's ``max_position_embeddings``, None when the config has none (or 0)."""
    value = getattr(text_config(config), "max_position_embeddings", None)
    return int(value) if value else None


def original_max_positions(config: Any, params: dict[str, Any]) -> int:
    """The original (pre-extension) context of one rope parameter set: its
    ``original_max_position_embeddings``, else the model's max positions (0 when unknown)."""
    return int(params.get("original_max_position_embeddings", max_positions(config) or 0))


def _rope_parameter_sets(config: Any) -> list[dict[str, Any]]:
    """Every rope parameter set of the config: one, or one per layer type (Gemma 3)."""
    params = getattr(text_config(config), "rope_parameters", None) or {}
    nested = [p for p in params.values() if isinstance(p, dict)]
    return nested if nested else [params]


def longrope_original_max(config: Any) -> int | None:
    """Cache length at which a LongRoPE model recomputes its keys with the long factors
    (``DecoderLM.reprefill_at``); None for every other rope type."""
    for params in _rope_parameter_sets(config):
        if params.get("rope_type") == "longrope":
            return original_max_positions(config, params)
    return None


def serving_context_window(config: Any) -> int:
    """Tokens one served sequence may hold (prompt + generated): the model's max positions
    (:data:`DEFAULT_CONTEXT` when the config has none), kept below a LongRoPE model's original
    length (crossing it would re-prefill the whole batch)."""
    ctx = max_positions(config) or DEFAULT_CONTEXT
    original = longrope_original_max(config)
    if original is not None:
        ctx = min(ctx, original)
    return int(ctx)


def read_generation_config(path: str | Path) -> dict[str, Any]:
    """The model directory's ``generation_config.json`` ({} when there is none); a
    :class:`~pace_core.errors.ConfigError` naming the file when it is not readable JSON."""
    file = Path(path) / "generation_config.json"
    if not file.exists():
        return {}
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
        raise ConfigError(f"{file} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ConfigError(f"{file} is not valid JSON: expected an object, got {kind}")
    return data


def resolve_eos_ids(
    generation_config: dict[str, Any] | None, config: Any, tokenizer: Any | None
) -> tuple[int, ...]:
    """The model's EOS ids: ``generation_config.json`` first, then the model config, then the
    tokenizer (the first that names any); () when none does."""
    for source in (
        (generation_config or {}).get("eos_token_id"),
        getattr(config, "eos_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ):
        if source is not None:
            return tuple(int(e) for e in source) if isinstance(source, list | tuple) else (
                int(source),
            )
    return ()
