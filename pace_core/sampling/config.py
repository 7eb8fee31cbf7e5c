"""Per-request sampling parameters: :class:`SamplingConfig`.

Semantics choices (documented once, here):

* ``temperature == 0`` means greedy decoding (as in vLLM / the OpenAI API), even when
  ``do_sample=True``. HF raises for ``temperature=0``; we accept it because API clients send it.
* ``max_new_tokens`` defaults to 128: HF's default (``max_length=20`` in total) is too short for
  chat, and an unbounded default would let one request hold a CPU batch slot for minutes.
* ``repetition_penalty`` follows HF (multiplicative, over prompt + generated tokens, applied once
  per distinct token); ``frequency_penalty`` / ``presence_penalty`` follow OpenAI (additive, over
  generated tokens only).
* :meth:`SamplingConfig.from_generation_config` applies only the keys present in a model's
  ``generation_config.json``; HF's implicit ``generate()`` defaults (e.g. ``top_k=50`` when
  sampling) are *not* injected, so ``top_k`` stays off unless the file sets it.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pace_core.values import is_int, is_real

__all__ = ["MAX_LOGPROBS", "SamplingConfig"]

MAX_LOGPROBS = 20
"""Largest accepted ``logprobs`` / ``prompt_logprobs`` (number of top alternatives)."""

_SEED_MAX = 2**64 - 1

# Keys of a HF generation_config.json that map 1:1 onto SamplingConfig fields.
_GENERATION_CONFIG_KEYS = (
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "max_new_tokens",
    "min_new_tokens",
    "eos_token_id",
    "num_beams",
    "length_penalty",
    "early_stopping",
)


def _fmt(value: Any) -> str:
    return repr(value)


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling parameters of one request. Validated on construction (raises ``ValueError``).

    Attributes:
        max_new_tokens: generation budget in new tokens (>= 1; default 128, see module doc).
        min_new_tokens: EOS is masked until this many tokens were generated (0..max_new_tokens).
        do_sample: sample from the distribution; ``False`` = greedy argmax.
        temperature: >= 0; 0 means greedy. Only applied to sampling rows.
        top_k: keep the k most likely tokens (ties at the k-th value kept, as HF); 0 = off.
        top_p: nucleus sampling mass in (0, 1]; 1 = off.
        min_p: drop tokens with prob < min_p * max prob, in [0, 1]; 0 = off.
        repetition_penalty: HF penalty (> 0) over prompt + generated tokens; 1 = off.
        frequency_penalty: OpenAI penalty in [-2, 2] times each token's generated count.
        presence_penalty: OpenAI penalty in [-2, 2] for tokens generated at least once.
        logit_bias: token id -> additive bias (``-inf`` bans a token); string keys are accepted.
        ignore_eos: keep generating after EOS (EOS is not masked, it just does not stop).
        eos_token_id: EOS id(s) for this request; ``None`` = the model's.
        stop: stop strings; the output is cut before the first occurrence.
        seed: seeds this request's private ``torch.Generator``; ``None`` = OS randomness.
        num_beams: beam width (beam search is not combined with sampling).
        length_penalty: beam-search length penalty exponent (HF semantics).
        early_stopping: beam-search early stopping (HF semantics; HF's ``"never"`` maps to False).
        logprobs: ``None`` = off, 0 = chosen token's logprob, k = also the top-k (k <= 20).
        prompt_logprobs: same for the prompt tokens.
        json_schema: constrain the output to JSON valid for this schema (a dict or a JSON
            string; ``{"type": "object"}`` = any JSON object); see ``sampling/grammar.py``.
        grammar: constrain the output to this Lark grammar (llguidance's dialect: ``start``
            rule, ``/regex/`` terminals, ``%json {...}`` for embedded schemas).
    """

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    ignore_eos: bool = False
    eos_token_id: int | list[int] | None = None
    stop: list[str] | None = None
    seed: int | None = None
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    json_schema: Mapping[str, Any] | str | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        self._normalize()
        self.validate()

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Names of all fields, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def _check_keys(cls, keys: Any, source: str) -> None:
        valid = cls.field_names()
        unknown = [k for k in keys if k not in valid]
        if not unknown:
            return
        parts = []
        for key in unknown:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            parts.append(f"{key!r}{hint}")
        raise ValueError(
            f"unknown sampling parameter(s) in {source}: {', '.join(parts)}; "
            f"valid keys: {', '.join(valid)}"
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SamplingConfig:
        """Build from a mapping; unknown keys raise ``ValueError`` listing the valid keys."""
        cls._check_keys(d.keys(), "from_dict")
        return cls(**dict(d))

    @classmethod
    def from_generation_config(
        cls, gen_cfg: Mapping[str, Any] | None, **overrides: Any
    ) -> SamplingConfig:
        """Defaults from a HF ``generation_config.json`` dict, then ``overrides`` win.

        Only sampling knobs present in the file (and not ``null``) apply; other keys (bos/pad
        ids, ``transformers_version``, ``max_length``, unsupported warpers, ...) are ignored.
        ``overrides`` use :class:`SamplingConfig` field names; unknown ones raise.
        """
        cls._check_keys(overrides.keys(), "overrides")
        values: dict[str, Any] = {}
        for key in _GENERATION_CONFIG_KEYS:
            if gen_cfg is None or gen_cfg.get(key) is None:
                continue
            value = gen_cfg[key]
            if key == "early_stopping" and isinstance(value, str):
                value = False  # HF "never": no early stopping heuristic
            values[key] = value
        values.update(overrides)
        try:
            return cls(**values)
        except ValueError as exc:
            raise ValueError(f"{exc} [generation_config merged with overrides]") from exc

    def merged(self, **overrides: Any) -> SamplingConfig:
        """A new validated config with ``overrides`` applied (unknown keys raise)."""
        self._check_keys(overrides.keys(), "merged")
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of all fields (round-trips through :meth:`from_dict`)."""
        return {name: getattr(self, name) for name in self.field_names()}

    # ------------------------------------------------------------------ derived properties
    @property
    def is_greedy(self) -> bool:
        """True when the token is the argmax: ``do_sample=False`` or ``temperature == 0``."""
        return not self.do_sample or self.temperature == 0.0

    @property
    def constrained(self) -> bool:
        """The output follows a ``json_schema`` or ``grammar``."""
        return self.json_schema is not None or self.grammar is not None

    @property
    def eos_token_ids(self) -> tuple[int, ...] | None:
        """``eos_token_id`` as a tuple, or None when the model's EOS should be used."""
        if self.eos_token_id is None:
            return None
        if is_int(self.eos_token_id):
            return (self.eos_token_id,)
        return tuple(self.eos_token_id)

    # ------------------------------------------------------------------ validation
    def _normalize(self) -> None:
        set_ = object.__setattr__
        if isinstance(self.stop, str):
            set_(self, "stop", [self.stop])
        elif isinstance(self.stop, tuple):  # a list or tuple of strings; anything else fails
            set_(self, "stop", list(self.stop))  # _check_stop, naming it
        if isinstance(self.eos_token_id, tuple):
            set_(self, "eos_token_id", list(self.eos_token_id))
        if self.logit_bias is not None and isinstance(self.logit_bias, Mapping):
            bias: dict[Any, Any] = {}
            for key, value in self.logit_bias.items():
                if isinstance(key, str) and key.strip().lstrip("-").isdigit():
                    key = int(key)
                bias[key] = value
            set_(self, "logit_bias", bias)
        if is_int(self.temperature):
            set_(self, "temperature", float(self.temperature))

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field, the bad value and the valid range."""
        self._check_int("max_new_tokens", lo=1)
        self._check_int("min_new_tokens", lo=0)
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens must be <= max_new_tokens={self.max_new_tokens} "
                f"(got {self.min_new_tokens})"
            )
        self._check_bool("do_sample")
        self._check_real("temperature", lo=0.0)
        self._check_int("top_k", lo=0)
        self._check_real("top_p", lo=0.0, hi=1.0, lo_open=True)
        self._check_real("min_p", lo=0.0, hi=1.0)
        self._check_real("repetition_penalty", lo=0.0, lo_open=True)
        self._check_real("frequency_penalty", lo=-2.0, hi=2.0)
        self._check_real("presence_penalty", lo=-2.0, hi=2.0)
        self._check_logit_bias()
        self._check_bool("ignore_eos")
        self._check_eos()
        self._check_stop()
        if self.seed is not None:
            self._check_int("seed", lo=0, hi=_SEED_MAX)
        self._check_int("num_beams", lo=1)
        self._check_real("length_penalty")
        self._check_bool("early_stopping")
        if self.num_beams > 1 and self.do_sample:
            raise ValueError(
                f"num_beams must be 1 when do_sample=True: beam sampling is not supported "
                f"(got num_beams={self.num_beams})"
            )
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                self._check_int(name, lo=0, hi=MAX_LOGPROBS, none_ok=True)
        self._check_constraint()

    def _check_bool(self, name: str) -> None:
        value = getattr(self, name)
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool (got {_fmt(value)})")

    def _check_int(
        self, name: str, lo: int | None = None, hi: int | None = None, none_ok: bool = False
    ) -> None:
        value = getattr(self, name)
        rng = _range_text(lo, hi, False, False)
        if not is_int(value):
            kind = "an int or None" if none_ok else "an int"
            raise ValueError(f"{name} must be {kind}{rng} (got {_fmt(value)})")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ValueError(f"{name} must be{rng} (got {_fmt(value)})")

    def _check_real(
        self,
        name: str,
        lo: float | None = None,
        hi: float | None = None,
        lo_open: bool = False,
    ) -> None:
        value = getattr(self, name)
        rng = _range_text(lo, hi, lo_open, False)
        if not is_real(value) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number{rng} (got {_fmt(value)})")
        too_low = lo is not None and (value <= lo if lo_open else value < lo)
        too_high = hi is not None and value > hi
        if too_low or too_high:
            raise ValueError(f"{name} must be{rng} (got {_fmt(value)})")

    def _check_logit_bias(self) -> None:
        bias = self.logit_bias
        if bias is None:
            return
        if not isinstance(bias, Mapping):
            raise ValueError(f"logit_bias must be a dict {{token_id: bias}} or None (got {bias!r})")
        for key, value in bias.items():
            if not is_int(key) or key < 0:
                raise ValueError(f"logit_bias keys must be token ids >= 0 (got {key!r})")
            ok = is_real(value) and not math.isnan(value) and value != math.inf
            if not ok:
                raise ValueError(
                    f"logit_bias[{key}] must be a finite number or -inf (got {_fmt(value)})"
                )

    def _check_eos(self) -> None:
        eos = self.eos_token_id
        if eos is None:
            return
        ids = [eos] if not isinstance(eos, list) else eos
        if not ids or not all(is_int(i) and i >= 0 for i in ids):
            raise ValueError(
                f"eos_token_id must be an int >= 0, a non-empty list of them, or None (got {eos!r})"
            )

    def _check_constraint(self) -> None:
        schema, grammar = self.json_schema, self.grammar
        if schema is not None:
            parsed = schema
            if isinstance(schema, str):
                try:
                    parsed = json.loads(schema)
                except ValueError as exc:
                    raise ValueError(f"json_schema is not valid JSON: {exc}") from None
            if not isinstance(parsed, Mapping):
                raise ValueError(
                    f"json_schema must be a JSON schema object (a dict or its JSON text), "
                    f"got {type(parsed).__name__}"
                )
        if grammar is not None and (not isinstance(grammar, str) or not grammar.strip()):
            raise ValueError(f"grammar must be a non-empty Lark grammar string (got {grammar!r})")
        if not self.constrained:
            return
        if schema is not None and grammar is not None:
            raise ValueError("give json_schema or grammar, not both")
        clashes = {
            "num_beams > 1": self.num_beams > 1,
            "min_new_tokens > 0": self.min_new_tokens > 0,
            "ignore_eos": self.ignore_eos,
        }
        for what, clash in clashes.items():
            if clash:
                raise ValueError(
                    f"{what} cannot be combined with json_schema / grammar (the grammar "
                    f"decides where the output ends); drop one of them"
                )

    def _check_stop(self) -> None:
        stop = self.stop
        if stop is None:
            return
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a list of non-empty strings or None (got {stop!r})")


def _num(x: float) -> str:
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def _range_text(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    if lo is not None and hi is not None:
        return f" in {'(' if lo_open else '['}{_num(lo)}, {_num(hi)}{')' if hi_open else ']'}"
    if lo is not None:
        return f" {'>' if lo_open else '>='} {_num(lo)}"
    if hi is not None:
        return f" {'<' if hi_open else '<='} {_num(hi)}"
    return ""
