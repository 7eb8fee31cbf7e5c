"""What ``LLMModel(..., spec_config=...)`` accepts: one of three validated configs, or a dict.

* :class:`PardSpecDecodeConfig`: a PARD parallel draft model (k tokens in one draft forward).
* :class:`DraftSpecDecodeConfig`: a classic small draft model (k autoregressive draft steps).
* :class:`PromptLookupConfig`: n-gram prompt lookup (copies from the context, no second model).

A dict needs a ``"method"`` key (``"pard"``, ``"draft"``, ``"prompt_lookup"``/``"ngram"``); its
other keys are the config's fields. Bad values raise :class:`~pace_core.errors.ConfigError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

from pace_core.errors import ConfigError

__all__ = [
    "DraftSpecDecodeConfig",
    "PardSpecDecodeConfig",
    "PromptLookupConfig",
    "SpecConfig",
    "coerce_spec_config",
]


def _check_k(k: Any) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ConfigError(f"num_speculative_tokens must be an int >= 1 (got {k!r})")


def _check_model(value: Any, method: str) -> None:
    if isinstance(value, str | os.PathLike) and str(value):
        return
    if hasattr(value, "model") and hasattr(value, "new_cache"):  # an already loaded LLMModel
        return
    raise ConfigError(
        f"{method}: model_name_or_path must be a path, a pace zoo name, a hub id or a loaded "
        f"LLMModel (got {value!r})"
    )


@dataclass(frozen=True)
class PardSpecDecodeConfig:
    """PARD: the draft gets the accepted tokens plus ``k - 1`` mask tokens and proposes ``k``
    tokens in one forward.

    ``pard_token``: the mask token id; ``None`` reads it from the draft's config.json (keys
    ``pard_token``, ``mask_token_id``, ``ptd_token_id``, then ``dflash_config.mask_token_id``).
    Any ``k >= 1`` works (no cap); the useful range depends on how the draft was trained.
    """

    model_name_or_path: Any
    num_speculative_tokens: int = 12
    pard_token: int | None = None

    method = "pard"

    def __post_init__(self) -> None:
        _check_model(self.model_name_or_path, self.method)
        _check_k(self.num_speculative_tokens)
        tok = self.pard_token
        if tok is not None and (not isinstance(tok, int) or isinstance(tok, bool) or tok < 0):
            raise ConfigError(f"pard_token must be a token id >= 0 or None (got {tok!r})")


@dataclass(frozen=True)
class DraftSpecDecodeConfig:
    """A classic draft model sharing the target's vocabulary: ``k`` autoregressive steps."""

    model_name_or_path: Any
    num_speculative_tokens: int = 4

    method = "draft"

    def __post_init__(self) -> None:
        _check_model(self.model_name_or_path, self.method)
        _check_k(self.num_speculative_tokens)


@dataclass(frozen=True)
class PromptLookupConfig:
    """N-gram prompt lookup: match the last ``n`` tokens (``max_ngram`` down to ``min_ngram``)
    earlier in the prompt + output and propose the ``k`` tokens that followed the match."""

    num_speculative_tokens: int = 8
    max_ngram: int = 3
    min_ngram: int = 1

    method = "prompt_lookup"

    def __post_init__(self) -> None:
        _check_k(self.num_speculative_tokens)
        for name in ("max_ngram", "min_ngram"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1 (got {value!r})")
        if self.min_ngram > self.max_ngram:
            raise ConfigError(
                f"min_ngram ({self.min_ngram}) must be <= max_ngram ({self.max_ngram})"
            )


SpecConfig = PardSpecDecodeConfig | DraftSpecDecodeConfig | PromptLookupConfig

_METHODS: dict[str, type] = {
    "pard": PardSpecDecodeConfig,
    "draft": DraftSpecDecodeConfig,
    "draft_model": DraftSpecDecodeConfig,
    "prompt_lookup": PromptLookupConfig,
    "ngram": PromptLookupConfig,
}


def coerce_spec_config(value: Any) -> SpecConfig:
    """A config object as is, or one built from a dict with a ``"method"`` key."""
    if isinstance(value, PardSpecDecodeConfig | DraftSpecDecodeConfig | PromptLookupConfig):
        return value
    if isinstance(value, Mapping):
        method = value.get("method")
        cls = _METHODS.get(str(method)) if method is not None else None
        if cls is None:
            raise ConfigError(
                f"spec_config: speculative decoding needs a 'method' in {sorted(_METHODS)} "
                f"(got {method!r} in {dict(value)!r})"
            )
        names = {f.name for f in fields(cls)}
        extra = sorted(set(value) - names - {"method"})
        if extra:
            raise ConfigError(
                f"spec_config: unknown key(s) {extra} for speculative method {method!r}; "
                f"valid: {sorted(names)}"
            )
        required = [f.name for f in fields(cls) if f.default is MISSING
                    and f.default_factory is MISSING and f.name not in value]  # fmt: skip
        if required:
            raise ConfigError(f"spec_config: speculative method {method!r} needs {required}")
        return cls(**{k: v for k, v in value.items() if k != "method"})
    raise ConfigError(
        "spec_config: speculative decoding takes a PardSpecDecodeConfig, DraftSpecDecodeConfig, "
        f"PromptLookupConfig or a dict with a 'method' key (got {type(value).__name__})"
    )
