"""What the front door knows of an engine instance: its handle and the events an instance
adds to the core's (:class:`Ready`: an engine process loaded its model; :class:`Dead`: an
instance stopped).

An instance is a :class:`~pace_core.engine.core.EngineCore` in a thread
(:class:`~pace_core.server.launch.local.LocalEngine`), in a process
(:class:`~pace_core.server.launch.multi.ProcessEngine`) or behind a Ray replica.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pace_core.engine import events as core_events
from pace_core.engine.events import SeqSpec


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


Event = core_events.Event | Ready | Dead
Deliver = Callable[..., None]  # (events, label=None): label names a replica in the metrics


@runtime_checkable
class EngineHandle(Protocol):
    """One engine instance as the :class:`~pace_core.server.frontdoor.frontend.Frontend` drives it.

    ``start`` hands it the callback that receives its event batches (called from the
    instance's own threads); ``wait_warm`` blocks until an instance that takes requests
    before it is ready has warmed up (the server listens only then); ``submit`` / ``cancel``
    may be called from the asyncio loop at any time; ``healthy`` is cleared by the front door
    when a submission is refused; ``failed`` says why an instance gave up for good.
    """

    name: str
    healthy: bool
    failed: str | None  # why it stopped for good (not restarted); None while it may serve
    capacity_tokens: int | None  # KV tokens of its pool (None until a process is ready)

    def start(self, deliver: Deliver) -> None: ...

    def wait_warm(self, timeout: float) -> bool: ...

    def submit(self, specs: list[SeqSpec]) -> None: ...

    def cancel(self, keys: list[str]) -> None: ...

    def shutdown(self, timeout: float = 10.0) -> None: ...
