"""The default engine instance: an :class:`~pace_core.engine.core.EngineCore` in a thread
of the server's own process (``--instances N`` runs them in processes instead, see
:mod:`pace_core.server.launch.multi`)."""

from __future__ import annotations

import logging
import threading

from pace_core.engine.config import EngineConfig
from pace_core.engine.core import EngineCore
from pace_core.engine.events import SeqSpec
from pace_core.engine.handle import ModelHandle
from pace_core.server.launch.instances import Dead, Deliver, Event

log = logging.getLogger("pace.server.engine")


class LocalEngine:
    """An :class:`EngineCore` running in a thread of this process (the default); an
    :class:`~pace_core.server.launch.instances.EngineHandle`."""

    def __init__(self, model: ModelHandle, config: EngineConfig, name: str = "0") -> None:
        self.name = name
        self.config = config
        self.core = EngineCore(model, config, self._emit, name)
        self.capacity_tokens: int | None = self.core.capacity_tokens
        self.block_size: int | None = self.core.block_size
        self.healthy = True
        self.failed: str | None = None  # a thread in this process: it never gives up alone
        self.pid = None
        self._deliver: Deliver | None = None
        self._thread: threading.Thread | None = None

    def start(self, deliver: Deliver) -> None:
        """``deliver`` is called from the engine thread with each batch of events."""
        self._deliver = deliver
        self._thread = threading.Thread(
            target=self._run, name=f"pace-engine-{self.name}", daemon=True
        )
        self._thread.start()

    def wait_warm(self, timeout: float) -> bool:
        """Block until the engine has warmed up (its pool committed, its prefill rate
        measured), at most ``timeout`` s; True once it has."""
        return self.core.warmed.wait(timeout)

    def _run(self) -> None:
        try:
            self.core.run()
        except BaseException as exc:  # a bug outside a step: fail everything in flight
            log.exception("engine %s: loop died", self.name)
            self.healthy = False
            self._emit([Dead(f"engine {self.name} stopped: {type(exc).__name__}: {exc}")])

    def _emit(self, events: list[Event]) -> None:
        if self._deliver is not None:
            self._deliver(events)

    @property
    def alive(self) -> bool:
        """The engine loop runs (or has not been started yet) and has not died."""
        thread = self._thread
        return self.healthy and (thread is None or thread.is_alive())

    @property
    def thread_id(self) -> int | None:
        """The engine thread's native id, once started."""
        return None if self._thread is None else self._thread.native_id

    def submit(self, specs: list[SeqSpec]) -> None:
        self.core.submit(specs)

    def cancel(self, keys: list[str]) -> None:
        self.core.cancel(keys)

    def shutdown(self, timeout: float = 10.0) -> None:
        self.core.stop()
        if self._thread is not None:
            self._thread.join(timeout)
