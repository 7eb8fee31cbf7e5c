"""How to quantize a checkpoint on load: :class:`QuantizationConfig` and its short names."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pace_core.errors import ConfigError
from pace_core.quant.weight import ACTIVATION_MODES

GROUP_SIZES = (32, 64, 128)
PER_CHANNEL = 0
"""``group_size`` meaning one scale per output row (int8 only)."""


def skip_list(value: Sequence[str] | str | None) -> tuple[str, ...]:
    """``"lm_head,embed_tokens"`` or a list -> a tuple of module-name substrings."""
    if value is None:
        return ()
    parts = value.split(",") if isinstance(value, str) else list(value)
    return tuple(p.strip() for p in parts if p.strip())


@dataclass(frozen=True)
class QuantizationConfig:
    """Quantize every matrix (linear layers, embeddings, LM head) of a model while loading.

    ``bits``: 8 or 4; ``group_size``: elements sharing one scale along a row (32, 64 or 128;
    0 = per output channel, int8 only); ``symmetric``: int4 without mins (``w = (q - 8) s``) or
    with them (``w = q s + m``); ``skip``: substrings of module names kept in the model dtype
    (e.g. ``"lm_head"``, ``"embed_tokens"``, ``"layers.0."``); ``head_bits``: the token
    embeddings and LM head are quantized to int8 with groups of 32 when 8 (the default: like
    llama.cpp, which keeps its output layer at 6-8 bits, since small models lose most of their
    quality there), or like every other matrix when equal to ``bits``; ``activations``:
    ``"int8"`` makes the matmuls W8A8 (int8 only: every activation row quantized to int8 when
    the kernel runs, a dynamic scale per row and group of 32, see
    ``pace_core.quant.weight.QuantizedWeight``), ``""`` leaves it to the backend.
    """

    bits: int = 8
    group_size: int = PER_CHANNEL
    symmetric: bool = True
    skip: tuple[str, ...] = field(default_factory=tuple)
    head_bits: int = 8
    activations: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "skip", skip_list(self.skip))  # a str is one name, not letters
        if self.bits not in (4, 8):
            raise ConfigError(f"quantization bits={self.bits!r} unsupported; use 8 or 4")
        allowed = (PER_CHANNEL, *GROUP_SIZES) if self.bits == 8 else GROUP_SIZES
        if self.group_size not in allowed:
            raise ConfigError(
                f"group_size={self.group_size!r} unsupported for int{self.bits}; use one of "
                f"{', '.join(map(str, allowed))}" + (" (0 = per channel)" if self.bits == 8 else "")
            )
        if self.bits == 8 and not self.symmetric:
            raise ConfigError("int8 is symmetric only; pass symmetric=True or bits=4")
        if self.activations not in ACTIVATION_MODES:
            raise ConfigError(
                f"quantization activations={self.activations!r} unsupported; use one of "
                f"{', '.join(repr(m) for m in ACTIVATION_MODES)}"
            )
        if self.activations and self.bits != 8:
            raise ConfigError("int8 activations (W8A8) need int8 weights: pass bits=8")
        if self.head_bits not in (self.bits, 8):
            raise ConfigError(
                f"head_bits={self.head_bits!r} unsupported; use 8 or bits ({self.bits})"
            )

    def for_head(self) -> QuantizationConfig:
        """The config of the token embeddings and the LM head."""
        if self.head_bits == self.bits:
            return self
        return QuantizationConfig(
            bits=8, group_size=32, skip=self.skip, activations=self.activations
        )

    @property
    def format(self) -> str:
        return f"int{self.bits}"

    @property
    def name(self) -> str:
        """A short label: ``int8``, ``int8-g32``, ``int4-g32``, ``int4-g32-asym``."""
        text = self.format + (f"-g{self.group_size}" if self.group_size else "")
        text += "" if self.symmetric else "-asym"
        text += "-a8" if self.activations == "int8" else ""
        return text + ("" if self.head_bits == 8 else f"-head{self.head_bits}")

    def skips(self, module: str) -> bool:
        return any(part in module for part in self.skip)

    def to_json(self) -> dict[str, Any]:
        """The ``quantization_config`` entry pace writes into a saved model's config.json."""
        return {"quant_method": "pace", **asdict(self), "skip": list(self.skip)}

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> QuantizationConfig:
        fields = {k: v for k, v in entry.items() if k != "quant_method"}
        try:
            return cls(**fields)
        except TypeError as exc:
            raise ConfigError(
                f"bad pace quantization_config {json.dumps(dict(entry))}: {exc}"
            ) from None


PRESETS: dict[str, QuantizationConfig] = {
    "int8": QuantizationConfig(bits=8, group_size=32),
    "int8-channel": QuantizationConfig(bits=8),
    "w8a8": QuantizationConfig(bits=8, activations="int8"),
    "int4": QuantizationConfig(bits=4, group_size=32, symmetric=False),
    "int4-g64": QuantizationConfig(bits=4, group_size=64, symmetric=False),
    "int4-g128": QuantizationConfig(bits=4, group_size=128, symmetric=False),
    "int4-sym": QuantizationConfig(bits=4, group_size=32),
    "int4-all": QuantizationConfig(bits=4, group_size=32, symmetric=False, head_bits=4),
}
"""Names accepted by ``quantization=`` and ``--quantization``. ``int8`` is groups of 32 (as
GGUF's Q8_0; ``int8-channel``, one scale per row, loses more); ``w8a8`` is ``int8-channel``
weights with int8 activations (dynamic, per row and group of 32: vpdpbusd on both operands,
the vLLM-CPU / SGLang scheme with finer activation scales). ``int4`` is groups of 32 with
mins (as GGUF's Q4_1): on the bundled models it loses far less than the symmetric ``int4-sym``
(Q4_0-like), see docs/quantization.md. The embeddings and head stay int8-g32 except in
``int4-all``."""


def coerce_quantization(
    value: QuantizationConfig | str | Mapping[str, Any] | None,
) -> QuantizationConfig | None:
    """A :class:`QuantizationConfig` from a preset name, a dict of its fields, or None."""
    if value is None or isinstance(value, QuantizationConfig):
        return value
    if isinstance(value, str):
        key = value.strip().lower()
        if key in ("", "none"):
            return None
        if key not in PRESETS:
            raise ConfigError(
                f"unknown quantization {value!r}; use one of {', '.join(PRESETS)}, or a "
                "QuantizationConfig(bits=4|8, group_size=0|32|64|128, symmetric=..., skip=[...])"
            )
        return PRESETS[key]
    if isinstance(value, Mapping):
        try:
            return QuantizationConfig(**value)
        except TypeError as exc:
            raise ConfigError(f"bad quantization fields {dict(value)}: {exc}") from None
    raise ConfigError(f"quantization must be a name, a dict or a QuantizationConfig, not {value!r}")


def add_quantization_argument(parser: Any) -> None:
    """``--quantization PRESET`` on a command that loads a model (generate, check, serve, ...)."""
    parser.add_argument(
        "--quantization",
        default=None,
        choices=list(PRESETS),
        help="quantize the dense matrices while loading (a GGUF file's quantized tensors "
        "keep their own formats)",
    )
