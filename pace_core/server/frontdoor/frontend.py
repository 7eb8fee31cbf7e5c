"""The front door's side of the engines: routing, queue limits, event fan-out, metrics.

Runs on the asyncio loop. Engines (threads or processes, each an
:class:`~pace_core.server.launch.instances.EngineHandle`) deliver event batches from their
own threads; :meth:`Frontend.deliver` hops onto the loop with ``call_soon_threadsafe`` and
fans the
:class:`~pace_core.engine.events.Token` and :class:`~pace_core.engine.events.SeqError` events
out to one :class:`Submission` (an ``asyncio.Queue``) per HTTP request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pace_core.engine.events import (
    Admitted,
    Embedding,
    ErrorKind,
    PromptLogprobs,
    SeqError,
    SeqSpec,
    SpecStep,
    Stats,
    Token,
)
from pace_core.server.api.protocol import APIError
from pace_core.server.frontdoor.metrics import Metrics
from pace_core.server.frontdoor.routing import PrefixRouter
from pace_core.server.launch.instances import Dead, EngineHandle, Event, Ready
from pace_core.speculative.stats import SpecStats

log = logging.getLogger("pace.server")


@dataclass
class _SeqState:
    sub: Submission
    instance: int
    last_token: float | None = None


@dataclass
class Submission:
    """The sequences of one HTTP request and the queue their events arrive on
    (:class:`Token` and :class:`SeqError`, and the delivery's deadline and disconnect
    sentinels)."""

    keys: list[str]
    instance: int
    created: float
    queue: asyncio.Queue[Token | SeqError | object] = field(default_factory=asyncio.Queue)
    remaining: set[str] = field(default_factory=set)
    first_token: float | None = None
    finish: dict[str, str] = field(default_factory=dict)
    spec: SpecStats | None = None  # speculative decoding counters of all its sequences
    cached: dict[str, int] = field(default_factory=dict)  # prompt tokens from the prefix cache

    @property
    def done(self) -> bool:
        return not self.remaining


class Frontend:
    """Routes requests to the least-loaded healthy instance and tracks what is in flight."""

    def __init__(
        self,
        instances: Sequence[EngineHandle],
        metrics: Metrics,
        *,
        max_running: int,
        max_queue: int,
    ) -> None:
        self.instances = list(instances)
        self.metrics = metrics
        self.max_running = max_running
        self.max_queue = max_queue
        self.outstanding = [0] * len(instances)
        self.stats: list[Stats] = [Stats()] * len(instances)
        self._seqs: dict[str, _SeqState] = {}
        self._ids = itertools.count()
        # cache-aware routing only matters between instances (one instance: no prompt hashing)
        slack = max(2, max_running // 4)
        self.router = PrefixRouter(slack=slack) if len(instances) > 1 else None
        self.loop: asyncio.AbstractEventLoop | None = None
        # each label's per-token series (a Ray replica behind an instance adds its own label)
        self._series = {inst.name: metrics.init_instance(inst.name) for inst in instances}

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        for i, inst in enumerate(self.instances):
            inst.start(lambda events, label=None, i=i: self._threadsafe(i, events, label))

    def wait_warm(self, timeout: float) -> bool:
        """Block until every instance has warmed up, at most ``timeout`` s in all; True if
        they all have."""
        deadline = time.monotonic() + timeout
        return all(inst.wait_warm(max(0.0, deadline - time.monotonic())) for inst in self.instances)

    def shutdown(self) -> None:
        for inst in self.instances:
            try:
                inst.shutdown()
            except Exception:
                log.exception("instance %s: shutdown failed", inst.name)

    def _threadsafe(self, index: int, events: list[Event], label: str | None = None) -> None:
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
            loop.call_soon_threadsafe(self.deliver, index, events, label)

    # -- capacity ------------------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        return any(inst.healthy for inst in self.instances)

    @property
    def gave_up(self) -> str | None:
        """Why, when every instance has given up (each ``failed``: down and not restarted);
        else None. ``pace serve`` then exits (launch/process.py)."""
        failed = [inst.failed for inst in self.instances]
        return failed[0] if failed and all(failed) else None

    def readiness(self) -> dict[str, Any]:
        """``/health``'s body: ``ok`` (every instance ready), ``degraded`` (some are: requests
        go to those while the others start or restart), ``starting`` (none: a 503) or
        ``failed`` (every instance gave up, ``error`` says why: a 503 until ``pace serve``
        exits, launch/process.py)."""
        ready = sum(1 for inst in self.instances if inst.healthy)
        total = len(self.instances)
        gave_up = self.gave_up
        if gave_up is not None:
            return {"status": "failed", "ready": 0, "instances": total, "error": gave_up}
        status = "ok" if ready == total else "degraded" if ready else "starting"
        return {"status": status, "ready": ready, "instances": total}

    def capacity_tokens(self) -> int | None:
        caps = [i.capacity_tokens for i in self.instances if i.capacity_tokens is not None]
        return min(caps) if caps else None

    def _choose(self, specs: list[SeqSpec]) -> int:
        """The instance for a request: the one holding the longest prefix of its prompt
        unless it is much busier (:class:`PrefixRouter`), else the least loaded; 429 when
        that one's queue is full, 503 when none is ready."""
        n = len(specs)
        candidates = [i for i, inst in enumerate(self.instances) if inst.healthy]
        if not candidates:
            raise APIError(
                503,
                "no engine instance is ready; retry shortly",
                "service_unavailable",
                code="engine_unavailable",
                headers={"Retry-After": "2"},
            )
        load_of = self.outstanding.__getitem__
        if self.router is None:
            best = min(candidates, key=lambda i: (load_of(i), i))
        else:
            first = specs[0]
            best = int(self.router.choose(first.prompt, first.cache_salt, candidates, load_of))
        load = self.outstanding[best]
        if load > 0 and load + n - self.max_running > self.max_queue:
            raise APIError(
                429,
                f"the server is at capacity ({load} sequences in flight on the least-loaded "
                "instance); retry later",
                "rate_limit_error",
                code="queue_full",
                headers={"Retry-After": "1"},
            )
        return best

    # -- submissions ---------------------------------------------------------------------
    def new_id(self) -> int:
        return next(self._ids)

    def submit(self, rid: str, specs: list[SeqSpec], prompt_tokens: int) -> Submission:
        """Route all ``specs`` (one request) to one instance; raises 429/503 APIError."""
        tried: set[int] = set()
        while True:
            index = self._choose(specs)
            if index in tried:
                raise APIError(
                    503,
                    "engine instances are restarting",
                    "service_unavailable",
                    headers={"Retry-After": "2"},
                )
            tried.add(index)
            inst = self.instances[index]
            sub = Submission([s.key for s in specs], index, time.monotonic())
            sub.remaining = set(sub.keys)
            for spec in specs:
                self._seqs[spec.key] = _SeqState(sub, index)
            self.outstanding[index] += len(specs)
            try:
                inst.submit(specs)
            except (OSError, ValueError, AttributeError) as exc:
                log.warning("instance %s refused a submission: %s", inst.name, exc)
                self._drop(sub)
                inst.healthy = False
                continue
            self.metrics.prompt_tokens.labels(inst.name).inc(prompt_tokens)
            if self.router is not None:
                distinct = {id(spec.prompt): spec for spec in specs}  # n choices share one
                for spec in distinct.values():
                    self.router.record(index, spec.prompt, spec.cache_salt)
            return sub

    def cancel(self, sub: Submission) -> None:
        """Stop the request's unfinished sequences and free their KV (client went away)."""
        keys = [k for k in sub.keys if k in sub.remaining]
        if keys:
            self.instances[sub.instance].cancel(keys)
        self._drop(sub)

    def _drop(self, sub: Submission) -> None:
        for key in list(sub.remaining):
            if self._seqs.pop(key, None) is not None:
                self.outstanding[sub.instance] -= 1
        sub.remaining.clear()

    def _finish(self, key: str, state: _SeqState) -> None:
        self._seqs.pop(key, None)
        state.sub.remaining.discard(key)
        self.outstanding[state.instance] -= 1

    # -- events --------------------------------------------------------------------------
    def deliver(self, index: int, events: list[Event], label: str | None = None) -> None:
        """Apply an instance's events; ``label`` names the replica behind an instance that
        spreads work itself (Ray Serve) in the metrics, else the instance's name."""
        name = label or self.instances[index].name
        series = self._series.get(name)
        if series is None:
            series = self._series[name] = self.metrics.init_instance(name)
        m = self.metrics
        now = time.monotonic()
        tokens = 0
        for ev in events:
            if isinstance(ev, Token):
                state = self._seqs.get(ev.key)
                if state is None:
                    continue  # cancelled meanwhile
                sub = state.sub
                tokens += 1
                if sub.first_token is None:
                    sub.first_token = now
                    series.ttft.observe(now - sub.created)
                if state.last_token is not None:
                    series.itl.observe(now - state.last_token)
                state.last_token = now
                reason = ev.finish_reason
                if reason is not None:
                    m.requests.labels(name, reason).inc()
                    self._finish(ev.key, state)
                    sub.finish[ev.key] = reason
                    if sub.done:
                        series.e2e.observe(now - sub.created)
                sub.queue.put_nowait(ev)
            elif isinstance(ev, SpecStep):
                m.record_spec_step(name, ev.proposed, ev.accepted)
                state = self._seqs.get(ev.key)
                if state is not None:
                    if state.sub.spec is None:
                        state.sub.spec = SpecStats()
                    state.sub.spec.record(ev.proposed, ev.accepted, ev.emitted)
            elif isinstance(ev, Admitted):
                state = self._seqs.get(ev.key)
                if state is not None:
                    m.queue_time.labels(name).observe(ev.queue_seconds)
                    m.prefix_queries.labels(name).inc(ev.prompt_tokens)
                    m.prefix_hits.labels(name).inc(ev.cached_tokens)
                    state.sub.cached[ev.key] = ev.cached_tokens
            elif isinstance(ev, PromptLogprobs):
                state = self._seqs.get(ev.key)
                if state is not None:
                    state.sub.queue.put_nowait(ev)
            elif isinstance(ev, SeqError | Embedding):
                state = self._seqs.get(ev.key)
                if state is None:
                    continue
                self._finish(ev.key, state)
                state.sub.queue.put_nowait(ev)
            elif isinstance(ev, Stats):
                self.stats[index] = ev
                series.running.set(ev.running)
                series.waiting.set(ev.waiting)
                series.kv_usage.set(ev.kv_used)
                series.kv_booked.set(ev.kv_booked)
            elif isinstance(ev, Dead):
                self._fail_instance(index, ev.reason)
            elif isinstance(ev, Ready):
                log.info("instance %s ready (pid %s)", name, ev.pid)
        if tokens:
            series.generation_tokens.inc(tokens)

    def _fail_instance(self, index: int, reason: str) -> None:
        for key, state in list(self._seqs.items()):
            if state.instance == index:
                self._finish(key, state)
                state.sub.queue.put_nowait(SeqError(key, reason, ErrorKind.ENGINE_ERROR))
        self.outstanding[index] = 0
        self.stats[index] = Stats()
        if self.router is not None:
            self.router.forget(index)
        series = self._series[self.instances[index].name]
        series.running.set(0)
        series.waiting.set(0)
