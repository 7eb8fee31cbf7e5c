"""A decoder LM used as an embedder: how its hidden states become one vector per input.

The rules come from the model directory's sentence-transformers files when it has them
(``modules.json``: a ``Pooling`` module, optional ``Dense`` layers and ``Normalize``;
``config_sentence_transformers.json``: the default prompt), else the usual ones for a decoder
LM (vLLM's too): the last token's state, L2-normalised. ``dimensions`` (OpenAI's field) is
allowed where the model says it was trained for truncation (``matryoshka_dimensions`` or
``is_matryoshka`` in ``config.json``).

:class:`PoolState` accumulates one input's pooled values chunk by chunk, so a long prompt
prefilled over several engine steps never needs all its states at once;
:class:`EmbeddingHead` turns the pooled values into the final vector.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pace_core.errors import ConfigError, ModelLoadError
from pace_core.values import is_int

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len", "weightedmean", "last")
"""Pooling modes in the order sentence-transformers concatenates them."""

_ST_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "last",
}
_ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": lambda x: x,
    "torch.nn.modules.activation.Tanh": torch.tanh,
}


@dataclass(frozen=True)
class DenseSpec:
    """A sentence-transformers ``Dense`` layer after pooling (its weights in ``path``)."""

    path: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str


@dataclass(frozen=True)
class EmbeddingConfig:
    """How a model's hidden states become an embedding (see the module doc).

    ``source`` says where the rules came from (``"sentence-transformers"`` or ``"default"``).
    """

    pooling: tuple[str, ...] = ("last",)
    normalize: bool = True
    dense: tuple[DenseSpec, ...] = ()
    hidden_size: int = 0
    matryoshka: tuple[int, ...] | bool = False  # allowed ``dimensions``; True: any
    prompt: str = ""  # prepended to text inputs (sentence-transformers' default prompt)
    source: str = "default"

    @property
    def dimensions(self) -> int:
        """Length of the vectors returned without ``dimensions``."""
        if self.dense:
            return self.dense[-1].out_features
        return self.hidden_size * len(self.pooling)

    def with_prompt(self, inputs: Any) -> Any:
        """Text ``inputs`` (one or a list) with the default prompt prepended."""
        if not self.prompt:
            return inputs
        if isinstance(inputs, str):
            return self.prompt + inputs
        if isinstance(inputs, list) and all(isinstance(t, str) for t in inputs):
            return [self.prompt + t for t in inputs]
        return inputs

    def check_dimensions(self, dimensions: int | None) -> None:
        """Raise ``ConfigError`` naming the allowed values unless ``dimensions`` is one."""
        full = self.dimensions
        if dimensions is not None and not (is_int(dimensions) and dimensions >= 1):
            raise ConfigError(f"dimensions must be a positive integer, not {dimensions!r}")
        if dimensions is None or dimensions == full:
            return
        if self.matryoshka is False:
            raise ConfigError(
                f"dimensions={dimensions}: this model was not trained for shortened embeddings "
                f"(no matryoshka_dimensions in its config.json); omit dimensions or pass {full}"
            )
        allowed = range(1, full + 1) if self.matryoshka is True else self.matryoshka
        if dimensions not in allowed:
            shown = f"1..{full}" if self.matryoshka is True else ", ".join(map(str, allowed))
            raise ConfigError(f"dimensions={dimensions} is not one this model allows: {shown}")


def coerce_pooling(pooling: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """A pooling override as modes (None: the model's); ConfigError for unknown ones."""
    if pooling is None:
        return None
    modes = tuple(pooling) if isinstance(pooling, list | tuple) else (pooling,)
    if not modes or any(m not in POOLING_MODES for m in modes):
        raise ConfigError(f"pooling {pooling!r}: use one or more of {', '.join(POOLING_MODES)}")
    return modes


def read_embedding_config(path: Path, hf_config: Any) -> EmbeddingConfig:
    """The embedding rules of the model at ``path`` (a directory, or a GGUF file: the
    defaults); ModelLoadError for sentence-transformers modules pace does not run, or an
    encoder that attends both ways."""
    text = getattr(hf_config, "text_config", None) or hf_config
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    if (
        getattr(text, "use_bidirectional_attention", False)
        or getattr(text, "is_causal", True) is False
    ):
        raise ModelLoadError(
            f"{path.name}: this model attends bidirectionally (an encoder such as "
            "EmbeddingGemma); pace's decoders attend causally, so its embeddings would be "
            "wrong; run it with sentence-transformers"
        )
    matryoshka: tuple[int, ...] | bool = bool(getattr(text, "is_matryoshka", False))
    dims = getattr(text, "matryoshka_dimensions", None)
    if dims:
        matryoshka = tuple(int(d) for d in dims)
    modules_file = path / "modules.json"
    if not path.is_dir() or not modules_file.is_file():
        return EmbeddingConfig(hidden_size=hidden, matryoshka=matryoshka)
    pooling: tuple[str, ...] = ("last",)
    normalize = False
    dense: list[DenseSpec] = []
    for module in _read_json(modules_file):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        where = path / str(module.get("path", ""))
        if kind == "Transformer":
            continue
        if kind == "Pooling":
            pooling = _st_pooling(where / "config.json")
        elif kind == "Dense":
            dense.append(_st_dense(where))
        elif kind == "Normalize":
            normalize = True
        else:
            raise ModelLoadError(
                f"{modules_file}: sentence-transformers module {module.get('type')!r} is not "
                "one pace runs (Transformer, Pooling, Dense, Normalize)"
            )
    return EmbeddingConfig(
        pooling, normalize, tuple(dense), hidden, matryoshka, _st_prompt(path),
        "sentence-transformers",
    )  # fmt: skip


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{file}: cannot read it ({exc})") from None


def _st_pooling(file: Path) -> tuple[str, ...]:
    config = _read_json(file)
    if config.get("include_prompt", True) is False:
        raise ModelLoadError(f"{file}: include_prompt=false (instruction pooling) is not supported")
    modes = tuple(mode for key, mode in _ST_POOLING_KEYS.items() if config.get(key))
    if not modes:
        raise ModelLoadError(f"{file}: no pooling mode is set")
    return modes


def _st_dense(folder: Path) -> DenseSpec:
    config = _read_json(folder / "config.json")
    activation = str(config.get("activation_function", "torch.nn.modules.linear.Identity"))
    if activation not in _ACTIVATIONS:
        raise ModelLoadError(
            f"{folder}: Dense activation {activation!r} is not supported "
            f"({', '.join(_ACTIVATIONS)})"
        )
    return DenseSpec(
        folder, int(config["in_features"]), int(config["out_features"]),
        bool(config.get("bias", True)), activation,
    )  # fmt: skip


def _st_prompt(path: Path) -> str:
    file = path / "config_sentence_transformers.json"
    if not file.is_file():
        return ""
    config = _read_json(file)
    name = config.get("default_prompt_name")
    return str((config.get("prompts") or {}).get(name, "")) if name else ""


class PoolState:
    """One input's pooled values so far, fed its hidden states chunk by chunk."""

    __slots__ = ("count", "first", "last", "maximum", "modes", "total", "weighted", "weights")

    def __init__(self, modes: tuple[str, ...]) -> None:
        self.modes = modes
        self.count = 0
        self.weights = 0.0
        self.first: torch.Tensor | None = None
        self.last: torch.Tensor | None = None
        self.maximum: torch.Tensor | None = None
        self.total: torch.Tensor | None = None
        self.weighted: torch.Tensor | None = None

    def add(self, hidden: torch.Tensor) -> None:
        """The next ``[n, H]`` states of the input, in order."""
        h = hidden.float()
        n = h.shape[0]
        if self.first is None:
            self.first = h[0].clone()
        self.last = h[-1].clone()
        if "max" in self.modes:
            m = h.amax(0)
            self.maximum = m if self.maximum is None else torch.maximum(self.maximum, m)
        if "mean" in self.modes or "mean_sqrt_len" in self.modes:
            s = h.sum(0)
            self.total = s if self.total is None else self.total + s
        if "weightedmean" in self.modes:  # weights 1..T by position, as sentence-transformers
            w = torch.arange(self.count + 1, self.count + n + 1, dtype=h.dtype)
            s = (h * w[:, None]).sum(0)
            self.weighted = s if self.weighted is None else self.weighted + s
            self.weights += float(w.sum())
        self.count += n

    def pooled(self) -> torch.Tensor:
        """The pooled vector, the modes concatenated in sentence-transformers' order."""
        parts = {
            "cls": lambda: self.first,
            "max": lambda: self.maximum,
            "mean": lambda: self.total / self.count,
            "mean_sqrt_len": lambda: self.total / math.sqrt(self.count),
            "weightedmean": lambda: self.weighted / self.weights,
            "last": lambda: self.last,
        }
        return torch.cat([parts[m]() for m in POOLING_MODES if m in self.modes])


@dataclass
class EmbeddingHead:
    """Pooled values -> the returned vector: the Dense layers, truncation to ``dimensions``,
    normalisation. Built once per model (the Dense weights are read then)."""

    config: EmbeddingConfig
    layers: list[tuple[torch.Tensor, torch.Tensor | None, Any]] = field(default_factory=list)

    @classmethod
    def for_model(cls, model: Any, path: Path, hf_config: Any) -> EmbeddingHead:
        """The head of a loaded pace ``model`` (a
        :class:`~pace_core.models.decoder.DecoderLM`); ConfigError / ModelLoadError for a
        model that cannot embed."""
        if not hasattr(model, "hidden_states"):
            raise ConfigError(
                f"model_type {hf_config.model_type!r} runs through transformers' own code "
                "(no pace family), which returns logits only; embeddings need a pace family"
            )
        return cls.load(read_embedding_config(path, hf_config))

    @classmethod
    def load(cls, config: EmbeddingConfig) -> EmbeddingHead:
        layers = []
        for spec in config.dense:
            weights = _dense_weights(spec.path)
            weight = weights.get("linear.weight")
            if weight is None or tuple(weight.shape) != (spec.out_features, spec.in_features):
                raise ModelLoadError(
                    f"{spec.path}: linear.weight missing or not "
                    f"[{spec.out_features}, {spec.in_features}]"
                )
            bias = weights.get("linear.bias") if spec.bias else None
            layers.append((weight.float(), None if bias is None else bias.float(),
                           _ACTIVATIONS[spec.activation]))  # fmt: skip
        return cls(config, layers)

    def start(self, embed: Any) -> PoolState:
        """The pool state of a new input embedded as ``embed`` (an
        :class:`~pace_core.engine.events.EmbedSpec`; ConfigError for its ``dimensions``)."""
        self.config.check_dimensions(embed.dimensions)
        return PoolState(embed.pooling or self.config.pooling)

    def finish(self, pool: PoolState, embed: Any) -> torch.Tensor:
        """The vector of a completed input."""
        return self(pool.pooled(), embed.dimensions, embed.normalize)

    def __call__(
        self, pooled: torch.Tensor, dimensions: int | None = None, normalize: bool | None = None
    ) -> torch.Tensor:
        """The vector of ``pooled`` values, cut to ``dimensions``, normalised when
        ``normalize`` (None: as the model's config says)."""
        x = pooled.float()
        for weight, bias, activation in self.layers:
            x = activation(torch.nn.functional.linear(x, weight, bias))
        if dimensions is not None:
            x = x[..., :dimensions]
        if self.config.normalize if normalize is None else normalize:
            x = torch.nn.functional.normalize(x, dim=-1)
        return x


def _dense_weights(folder: Path) -> dict[str, torch.Tensor]:
    st = folder / "model.safetensors"
    if st.is_file():
        from safetensors.torch import load_file

        return load_file(str(st))
    pt = folder / "pytorch_model.bin"
    if pt.is_file():
        return torch.load(pt, map_location="cpu", weights_only=True)
    raise ModelLoadError(f"{folder}: no model.safetensors or pytorch_model.bin for the Dense layer")
