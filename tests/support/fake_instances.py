"""A stand-in engine instance for front-door tests (no engine behind it): the attributes the
:class:`~pace_core.server.frontdoor.frontend.Frontend` reads, and the submissions it routes."""

from __future__ import annotations


class FakeInstance:
    """An :class:`~pace_core.server.launch.instances.EngineHandle` that records what it is
    given: ``submitted`` holds each submission's sequence keys."""

    def __init__(self, name: str, healthy: bool = True, failed: str | None = None,
                 capacity_tokens: int | None = 4096) -> None:  # fmt: skip
        self.name, self.healthy, self.failed = name, healthy, failed
        self.capacity_tokens = capacity_tokens
        self.submitted: list[list[str]] = []

    def start(self, deliver) -> None: ...

    def wait_warm(self, timeout: float) -> bool:
        return True

    def submit(self, specs) -> None:
        self.submitted.append([s.key for s in specs])

    def cancel(self, keys) -> None: ...

    def shutdown(self, timeout: float = 10.0) -> None: ...
