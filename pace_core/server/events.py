"""What the scheduler, the router and the HTTP side say to each other, as types.

* :class:`SeqSpec`: one sequence sent to an engine.
* Commands, front door -> engine (over a queue in-process, a pipe to an engine process):
  :class:`Submit`, :class:`Cancel`, :class:`Stop`.
* Events, engine -> front door, delivered as one ``list`` per scheduler iteration:
  :class:`Admitted`, :class:`Token`, :class:`SpecStep`, :class:`SeqError`, :class:`Stats`, and
  from the instance wrappers :class:`Ready` (an engine process loaded its model) and
  :class:`Dead` (an instance stopped).
* :class:`EngineHandle`: what the :class:`~pace_core.server.frontend.Frontend` needs of an
  engine instance (:class:`~pace_core.server.local.LocalEngine`, a thread, or
  :class:`~pace_core.server.multi.ProcessEngine`, a process).

Every message is a plain module-level dataclass of builtins, so it pickles (engine processes
send them through ``multiprocessing`` pipes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from pace_core.sampling.config import SamplingConfig


@dataclass
class SeqSpec:
    """One sequence (one choice of one request) as sent to an engine; picklable."""

    key: str
    prompt: list[int]
    config: SamplingConfig
    arrival: float = field(default_factory=time.monotonic)
    cache_salt: str = ""  # isolates this request's prefix-cache entries (tenants)

    @property
    def reserve_tokens(self) -> int:
        return len(self.prompt) + self.config.max_new_tokens


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


@dataclass(frozen=True)
class SpecStep:
    """One speculative verification step of a sequence (sent before that step's tokens)."""

    key: str
    proposed: int
    accepted: int
    emitted: int


@dataclass(frozen=True)
class SeqError:
    """A sequence failed; answered to its request with ``status`` in the OpenAI error shape."""

    key: str
    message: str
    error_type: str
    status: int


@dataclass(frozen=True)
class Stats:
    """Load of an instance: sequences running (prefill + decode) and waiting, and the
    fractions of its KV blocks in use and booked."""

    running: int = 0
    waiting: int = 0
    kv_used: float = 0.0
    kv_booked: float = 0.0


@dataclass(frozen=True)
class Ready:
    """An engine process has loaded its model and serves."""

    capacity_tokens: int
    block_size: int
    pid: int


@dataclass(frozen=True)
class Dead:
    """An instance stopped; its in-flight sequences fail with ``reason``."""

    reason: str


Event = Admitted | Token | SpecStep | SeqError | Stats | Ready | Dead
Deliver = Callable[..., None]  # (events, label=None): label names a replica in the metrics


# -- the engine instance seen by the front door ---------------------------------------------
@runtime_checkable
class EngineHandle(Protocol):
    """One engine instance as the :class:`~pace_core.server.frontend.Frontend` drives it.

    ``start`` hands it the callback that receives its event batches (called from the
    instance's own threads); ``wait_warm`` blocks until an instance that takes requests
    before it is ready has warmed up (the server listens only then); ``submit`` / ``cancel``
    may be called from the asyncio loop at any time; ``healthy`` is cleared by the front door
    when a submission is refused.
    """

    name: str
    healthy: bool
    capacity_tokens: int | None  # KV tokens of its pool (None until a process is ready)

    def start(self, deliver: Deliver) -> None: ...

    def wait_warm(self, timeout: float) -> bool: ...

    def submit(self, specs: list[SeqSpec]) -> None: ...

    def cancel(self, keys: list[str]) -> None: ...

    def shutdown(self, timeout: float = 10.0) -> None: ...
