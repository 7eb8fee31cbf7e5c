"""What the engine core takes and tells, as types (no HTTP in them).

* :class:`SeqSpec`: one sequence submitted to the core (to generate from, or with an
  :class:`EmbedSpec`, to embed).
* Commands, caller -> core (over a queue in-process, a pipe to an engine process):
  :class:`Submit`, :class:`Cancel`, :class:`Stop`.
* Events, core -> caller, delivered as one ``list`` per scheduler iteration:
  :class:`Admitted`, :class:`PromptLogprobs`, :class:`Token`, :class:`Embedding`,
  :class:`SpecStep`, :class:`SeqError`, :class:`Stats`.

A failure is a :class:`SeqError` of an :class:`ErrorKind`; what a kind means to a client (an
HTTP status, an OpenAI error type) is the server's business. Every message is a plain
module-level dataclass of builtins, so it pickles (engine processes send them through
``multiprocessing`` pipes).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from pace_core.engine.output import TokenLogprob
from pace_core.errors import ConfigError
from pace_core.sampling.config import SamplingConfig


class ErrorKind(str, enum.Enum):
    """Why a sequence failed."""

    INVALID_REQUEST = "invalid_request"  # the sequence itself is wrong (its parameters, size)
    UNAVAILABLE = "unavailable"  # the engine is shutting down; retry elsewhere or later
    ENGINE_ERROR = "engine_error"  # a step failed; the engine reset and serves on


@dataclass(frozen=True)
class EmbedSpec:
    """Embed the prompt instead of generating: pooled by the model's rules
    (:mod:`pace_core.models.embedding`) or ``pooling``, cut to ``dimensions``, normalised
    when ``normalize`` (None: as the model says)."""

    pooling: tuple[str, ...] | None = None
    normalize: bool | None = None
    dimensions: int | None = None

    def __post_init__(self) -> None:
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ConfigError(f"normalize must be True, False or None, not {self.normalize!r}")


@dataclass
class SeqSpec:
    """One sequence (one choice of one request) as sent to an engine; picklable."""

    key: str
    prompt: list[int]
    config: SamplingConfig
    arrival: float = field(default_factory=time.monotonic)
    cache_salt: str = ""  # isolates this request's prefix-cache entries (tenants)
    embed: EmbedSpec | None = None  # embed the prompt: no tokens are generated

    @property
    def keeps_every_position(self) -> bool:
        """Its prefill needs every prompt position's hidden state (an embedding pools them,
        prompt logprobs score them), so no cached prefix can stand in for it."""
        return self.embed is not None or self.config.prompt_logprobs is not None

    @property
    def reserve_tokens(self) -> int:
        return len(self.prompt) + (0 if self.embed else self.config.max_new_tokens)


# -- commands: front door -> engine ------------------------------------------------------------
@dataclass(frozen=True)
class Submit:
    """Queue these sequences (the choices of one request)."""

    specs: list[SeqSpec]


@dataclass(frozen=True)
class Cancel:
    """Drop these sequences wherever they are and free their KV."""

    keys: list[str]


@dataclass(frozen=True)
class Stop:
    """Fail what is in flight (503) and end the engine loop."""


Command = Submit | Cancel | Stop


# -- events: engine -> front door --------------------------------------------------------------
@dataclass(frozen=True)
class Admitted:
    """A sequence left the waiting queue after ``queue_seconds``; ``cached_tokens`` of its
    ``prompt_tokens`` came from the prefix cache."""

    key: str
    queue_seconds: float
    prompt_tokens: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True)
class Token:
    """One generated token of a sequence: its id, the text it adds (stop strings are held
    back until they cannot match), the finish reason when it ended the sequence, and its
    logprobs when the sequence asked for them (the top ones when it asked for ``k > 0``)."""

    key: str
    token: int
    text: str
    finish_reason: str | None = None
    logprob: float | None = None
    top_ids: list[int] | None = None
    top_logprobs: list[float] | None = None
    logits: torch.Tensor | None = None  # [V] raw logits, when the core keeps them (offline)


@dataclass(frozen=True)
class PromptLogprobs:
    """The prompt logprobs of a sequence that asked for them (``SamplingConfig.prompt_logprobs``),
    sent before its first token: None for the first prompt token, then each later one's."""

    key: str
    entries: list[TokenLogprob | None]


@dataclass(frozen=True)
class Embedding:
    """The embedding of a sequence submitted with an :class:`EmbedSpec` (it is finished)."""

    key: str
    vector: torch.Tensor  # [D] float32
    prompt_tokens: int


@dataclass(frozen=True)
class SpecStep:
    """One speculative verification step of a sequence (sent before that step's tokens)."""

    key: str
    proposed: int
    accepted: int
    emitted: int


@dataclass(frozen=True)
class SeqError:
    """A sequence failed, for a reason of ``kind``."""

    key: str
    message: str
    kind: ErrorKind


@dataclass(frozen=True)
class Stats:
    """Load of an instance: sequences running (prefill + decode) and waiting, and the
    fractions of its KV blocks in use and booked."""

    running: int = 0
    waiting: int = 0
    kv_used: float = 0.0
    kv_booked: float = 0.0


Event = Admitted | PromptLogprobs | Token | Embedding | SpecStep | SeqError | Stats
