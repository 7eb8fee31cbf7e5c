"""pace on Ray Serve: engine replicas on many machines behind one OpenAI endpoint.

Two deployments (``pip install 'pace-core[ray]'``):

* ``PaceEngine``: each replica loads the model and runs one pace engine
  (:class:`~pace_core.server.launch.local.LocalEngine`) in a thread on ``threads`` cores
  (``ray_actor_options={"num_cpus": threads}``; its threads pinned to cores of their own by
  the replica's rank on its node, :func:`pin_cores`). ``submit(specs)`` is a streaming method: it
  yields ``(replica, events)`` batches of the request's sequences until they finish and
  cancels them in the engine when the caller goes away. ``check_health`` is the engine's own
  health (its loop thread alive), so Ray replaces a replica whose engine died.
* ``PaceIngress``: the same FastAPI app as ``pace serve`` (:func:`~pace_core.server.api.app.
  create_app`: routes, validation, errors, streaming, metrics), whose front door has one
  engine instance, :class:`RayEngines`, forwarding each request to ``PaceEngine`` through a
  Ray Serve handle. Ray picks the replica with :class:`PrefixAffinityRouter` (the replica
  that served the longest prefix of the prompt unless its queue is longer than the shortest
  by more than ``slack``; least loaded otherwise) and autoscales on ongoing requests. Every
  replica's events reach the ingress, so its ``/metrics`` covers all replicas, with a
  ``instance`` label naming the replica.

A replica that dies mid-request fails that request's sequences with a retryable 503 (never a
hang); Ray starts a replacement and later requests succeed. ``pace serve --ray`` runs it;
:func:`build_app` is the entry for users who compose their own Ray Serve applications.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from pace_core.engine.config import EngineConfig
from pace_core.engine.events import ErrorKind, SeqError, SeqSpec, Stats, Token
from pace_core.server.frontdoor.context import ServerConfig
from pace_core.server.frontdoor.routing import PrefixRouter
from pace_core.server.launch.instances import Deliver, Event

log = logging.getLogger("pace.server.ray")

INGRESS_MAX_ONGOING = 4096

__all__ = ["PaceEngine", "PaceIngress", "PrefixAffinityRouter", "RayEngines", "build_app"]


class PaceEngine:
    """One engine replica (a Ray Serve deployment class; see module doc)."""

    def __init__(self, model_args: dict[str, Any], engine_config: EngineConfig) -> None:
        import torch

        from pace_core.engine.llm import LLMModel
        from pace_core.server.launch.local import LocalEngine

        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id if context else "local"
        if engine_config.threads:
            self.pinned = pin_cores(_local_rank(context), engine_config.threads)
            torch.set_num_threads(engine_config.threads)
        self.engine = LocalEngine(LLMModel(**model_args).handle, engine_config, self.replica)
        self._streams: dict[str, asyncio.Queue[list[Event]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def _start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self.engine.start(self._from_engine)

    def _from_engine(self, events: list[Event], label: str | None = None) -> None:
        """Engine thread -> the replica's event loop."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._route, events)

    def _route(self, events: list[Event]) -> None:
        """Each stream gets its sequences' events; the engine's load (:class:`Stats`, sent
        when it changes) rides along to every open stream, for the ingress's gauges."""
        batches: dict[int, tuple[asyncio.Queue, list[Event]]] = {}
        stats = [ev for ev in events if isinstance(ev, Stats)]
        for ev in events:
            queue = self._streams.get(getattr(ev, "key", ""))
            if queue is not None:
                batches.setdefault(id(queue), (queue, []))[1].append(ev)
        if stats:
            for queue in {id(q): q for q in self._streams.values()}.values():
                batches.setdefault(id(queue), (queue, []))[1].append(stats[-1])
        for queue, batch in batches.values():
            queue.put_nowait(batch)

    async def submit(self, specs: list[SeqSpec]) -> AsyncIterator[tuple[str, list[Event]]]:
        """Run ``specs`` on this replica's engine; yields ``(replica, events)`` until every
        sequence finished; cancels the unfinished ones when the caller goes away."""
        self._start()
        queue: asyncio.Queue[list[Event]] = asyncio.Queue()
        left = {s.key for s in specs}
        for key in left:
            self._streams[key] = queue
        self.engine.submit(specs)
        try:
            while left:
                batch = await queue.get()
                while not queue.empty():  # a slow reader gets one message, not a backlog
                    batch += queue.get_nowait()
                for ev in batch:
                    if isinstance(ev, SeqError) or (
                        isinstance(ev, Token) and ev.finish_reason is not None
                    ):
                        left.discard(ev.key)
                yield self.replica, batch
        finally:
            for key in {s.key for s in specs}:
                self._streams.pop(key, None)
            if left:
                self.engine.cancel(sorted(left))

    async def capacity_tokens(self) -> int | None:
        return self.engine.capacity_tokens

    async def cores(self) -> list[int]:
        """The cores the engine thread may run on."""
        self._start()
        return sorted(os.sched_getaffinity(self.engine.thread_id or 0))

    def check_health(self) -> None:
        """Ray's health check: the engine loop must be alive."""
        if not self.engine.alive:
            raise RuntimeError(f"pace engine of replica {self.replica} stopped")

    def __del__(self) -> None:
        if getattr(self, "engine", None) is not None:
            self.engine.shutdown(timeout=5.0)


def _local_rank(context: Any) -> int:
    rank = getattr(context, "rank", None)
    return int(getattr(rank, "local_rank", 0) or 0)


def pin_cores(local_rank: int, threads: int) -> list[int] | None:
    """Pin every thread of this replica process (and so the threads they start: the engine
    and its OpenMP pool) to cores of its own, and prefer their NUMA node's memory for the
    calling thread (which loads the weights): replica ``local_rank`` on a machine takes the
    ``local_rank``-th group of ``threads`` physical cores
    (:func:`~pace_core.platform.placement.plan_replica`). Skipped (None) when the
    machine has too few cores for that: Ray still bounds the replica's CPU share by
    ``num_cpus``."""
    from pace_core.platform import current_topology
    from pace_core.platform.binding import prefer_node
    from pace_core.platform.placement import plan_replica

    topology = current_topology()
    plan = plan_replica(topology, local_rank, threads)
    if plan is None:
        log.warning("replica rank %d x %d threads: only %d physical cores, not pinned",
                    local_rank, threads, len(topology.cores))  # fmt: skip
        return None
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task), plan.cores)
    if plan.numa_node is not None:
        prefer_node(plan.numa_node)
    return list(plan.cores)


class RayEngines:
    """The ingress front door's one engine instance: every submission is a streaming call
    of ``PaceEngine.submit`` on the replica Ray routes it to (an
    :class:`~pace_core.server.launch.instances.EngineHandle`)."""

    def __init__(self, handle: Any, name: str = "ray") -> None:
        self.name = name
        self.healthy = True
        self.failed: str | None = None  # Ray Serve restarts its replicas itself
        self.capacity_tokens: int | None = None
        self._handle = handle.options(stream=True)
        self._deliver: Deliver | None = None
        self._tasks: dict[str, asyncio.Task] = {}
        self._left: dict[str, set[str]] = {}  # key -> its request's unfinished keys
        self._cancelled: set[str] = set()

    def start(self, deliver: Deliver) -> None:
        self._deliver = deliver

    def wait_warm(self, timeout: float) -> bool:
        """True: each replica's engine warms up in its own process, before its first step."""
        return True

    def submit(self, specs: list[SeqSpec]) -> None:
        task = asyncio.get_running_loop().create_task(self._run(specs))
        for spec in specs:
            self._tasks[spec.key] = task

    async def _run(self, specs: list[SeqSpec]) -> None:
        left = {s.key for s in specs}
        for key in left:
            self._left[key] = left
        try:
            async for replica, events in self._handle.submit.remote(specs):
                for ev in events:
                    if isinstance(ev, SeqError) or (
                        isinstance(ev, Token) and ev.finish_reason is not None
                    ):
                        left.discard(ev.key)
                self._send(events, replica)
                if left and left <= self._cancelled:  # what still runs was cancelled: end the
                    asyncio.current_task().cancel()  # call as cancel() does (at the next await)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the replica died or Ray could not reach it
            log.warning("ray replica failed a request: %s: %s", type(exc).__name__, exc)
            reason = f"the engine replica serving this request failed ({type(exc).__name__}); retry"
            self._send([SeqError(k, reason, ErrorKind.ENGINE_ERROR) for k in sorted(left)])
        finally:
            for spec in specs:
                self._tasks.pop(spec.key, None)
                self._left.pop(spec.key, None)
                self._cancelled.discard(spec.key)

    def _send(self, events: list[Event], replica: str | None = None) -> None:
        if self._deliver is not None and events:
            self._deliver(events, replica)

    def cancel(self, keys: list[str]) -> None:
        """Stop sequences: a request's streaming call ends (and its replica cancels what it
        still runs) once every unfinished sequence of it is cancelled; one choice of several
        that a stop string ended runs on until the call ends (its tokens are dropped)."""
        self._cancelled.update(k for k in keys if k in self._tasks)
        for key in keys:
            left = self._left.get(key)
            if left is not None and left <= self._cancelled:
                self._tasks[key].cancel()

    def shutdown(self, timeout: float = 10.0) -> None:
        for task in set(self._tasks.values()):
            task.cancel()


class PaceIngress:
    """The OpenAI front door (a Ray Serve deployment class wrapped with ``serve.ingress``;
    the FastAPI app is built on the replica, after ``__init__``)."""

    def __init__(
        self,
        engine: Any,
        model_args: dict[str, Any],
        engine_config: EngineConfig,
        server_config: ServerConfig,
    ) -> None:
        from pace_core.server.frontdoor.server import Server

        self.server = Server.for_engines(model_args, [RayEngines(engine)], engine_config,
                                         server_config)  # fmt: skip

    def __serve_build_asgi_app__(self) -> Any:
        from pace_core.server.api.app import create_app

        return create_app(self.server)


class PrefixAffinityRouter(FIFOMixin, RequestRouter):
    """Ray Serve request router of ``PaceEngine``: a request goes to the replica that served
    the longest prefix of its prompt (remembered per replica, as
    :class:`~pace_core.server.frontdoor.routing.PrefixRouter` does for ``--instances``) unless that
    replica's queue is longer than the shortest by more than ``slack``; otherwise Ray probes
    all candidates and takes the least loaded."""

    def initialize_state(self, slack: int = 4, **_: Any) -> None:
        self.prefixes = PrefixRouter(slack=slack)

    @staticmethod
    def _spec(pending: PendingRequest | None) -> SeqSpec | None:
        if pending is None or not pending.args or not pending.args[0]:
            return None
        first = pending.args[0][0]
        return first if isinstance(first, SeqSpec) else None

    def _load(self, replica: RunningReplica) -> int:
        return self._replica_queue_len_cache.get(replica.replica_id) or 0

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        spec = self._spec(pending_request)
        if spec is None or len(candidate_replicas) < 2:
            return [candidate_replicas]
        by_id = {r.replica_id: r for r in candidate_replicas}
        loads = {r.replica_id: self._load(r) for r in candidate_replicas}
        best = self.prefixes.choose(spec.prompt, spec.cache_salt, list(by_id), loads.__getitem__)
        if self.prefixes.held(best, self.prefixes.keys(spec.prompt, spec.cache_salt)):
            return [[by_id[best]], candidate_replicas]
        return [candidate_replicas]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: Any, result: Any):
        spec = self._spec(pending_request)
        if spec is not None:
            self.prefixes.record(replica_id, spec.prompt, spec.cache_salt)

    def on_replica_actor_died(self, replica_id: Any) -> None:
        super().on_replica_actor_died(replica_id)
        self.prefixes.forget(replica_id)


def build_app(
    model_args: dict[str, Any],
    engine_config: EngineConfig | None = None,
    server_config: ServerConfig | None = None,
    *,
    replicas: int = 1,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    threads: int = 1,
) -> Any:
    """The Ray Serve application: ``PaceIngress`` over ``PaceEngine`` replicas of
    ``threads`` CPUs each; ``replicas`` fixed, or autoscaled between ``min_replicas`` and
    ``max_replicas`` on ongoing requests (target: half of ``max_running`` per replica)."""
    from pace_core.server.frontdoor.server import resolved_model_args

    engine_config = engine_config or EngineConfig()
    engine_config.threads = threads
    server_config = server_config or ServerConfig()
    model_args = resolved_model_args(model_args)
    scaling: dict[str, Any] = {"num_replicas": replicas}
    if min_replicas is not None or max_replicas is not None:
        low = replicas if min_replicas is None else min_replicas
        high = max(low, replicas if max_replicas is None else max_replicas)
        target = max(1, engine_config.max_running // 2)
        scaling = {
            "num_replicas": "auto",
            "autoscaling_config": {
                "min_replicas": low, "max_replicas": high, "initial_replicas": max(low, 1),
                "target_ongoing_requests": target, "upscale_delay_s": 10.0,
            },
        }  # fmt: skip
    engine = serve.deployment(PaceEngine).options(
        name="PaceEngine",
        ray_actor_options={"num_cpus": threads},
        max_ongoing_requests=engine_config.max_running + engine_config.max_queue,
        health_check_period_s=5,
        request_router_config=RequestRouterConfig(
            request_router_class=PrefixAffinityRouter,
            request_router_kwargs={"slack": max(2, engine_config.max_running // 4)},
        ),
        **scaling,
    )
    # the ingress only relays: it must take every request the engines can queue (Ray's
    # default of 5 ongoing requests per replica would queue them in front of the engines)
    ingress = serve.deployment(serve.ingress()(PaceIngress)).options(
        name="PaceIngress",
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=INGRESS_MAX_ONGOING,
    )
    return ingress.bind(engine.bind(model_args, engine_config), model_args, engine_config,
                        server_config)  # fmt: skip
