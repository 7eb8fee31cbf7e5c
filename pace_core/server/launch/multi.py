"""Multi-instance serving: engine processes, each placed by a launch plan, behind one front door.

Each instance is a ``spawn``-ed process placed by its
:class:`~pace_core.platform.placement.InstancePlan`: it pins itself to the plan's cores,
prefers its NUMA node's memory (:mod:`~pace_core.platform.binding`) before loading the
model, and runs an :class:`~pace_core.engine.core.EngineCore` with an OpenMP team of the
plan's size (``OMP_NUM_THREADS`` in its environment, ``torch.set_num_threads``). The front door
talks to it over two one-way pipes: commands (:class:`~pace_core.engine.events.Submit` /
``Cancel`` / ``Stop``) down, event batches (:mod:`pace_core.engine.events`, a
:class:`~pace_core.server.launch.instances.Ready` first) up. A reader thread per instance
forwards events to the front door; when the pipe breaks (the process died) the instance
reports :class:`~pace_core.server.launch.instances.Dead` -- the front door fails that
instance's in-flight requests only and routes around it -- and a new process is spawned,
which rejoins routing with its ``Ready``. The child exits by itself when the parent's end of
the command pipe closes, so no orphan outlives the server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from pace_core.engine.config import EngineConfig
from pace_core.engine.core import EngineCore
from pace_core.engine.events import Cancel, Command, SeqSpec, Stop, Submit
from pace_core.platform.binding import apply_plan
from pace_core.platform.placement import InstancePlan
from pace_core.server.launch.instances import Dead, Deliver, Event, Ready
from pace_core.server.launch.threads import on_transient_thread

log = logging.getLogger("pace.server.multi")
MAX_EARLY_DEATHS = 3  # a process that dies before its Ready this often in a row is not restarted


def _instance_main(
    name: str,
    model_args: dict[str, Any],
    config: EngineConfig,
    plan: InstancePlan,
    cmd_conn: Any,
    evt_conn: Any,
) -> None:
    """Body of an instance process."""
    import torch

    from pace_core.engine.llm import LLMModel

    apply_plan(plan, name)  # before the weights load: they land on the plan's node
    threads = config.threads or max(1, plan.omp_threads)
    torch.set_num_threads(threads)
    config = dataclasses.replace(config, threads=threads)

    def load() -> LLMModel:
        torch.set_num_threads(threads)  # per thread in libgomp
        return LLMModel(**model_args)

    llm = on_transient_thread(load)
    lock = threading.Lock()

    def emit(events: list[Event]) -> None:
        with lock:
            evt_conn.send(events)

    core = EngineCore(llm.handle, config, emit, name)
    # Ready (the first event) once warm: no request during the warm-up, which measures the
    # prefill rate
    ready = [Ready(core.capacity_tokens, core.block_size, os.getpid())]
    thread = threading.Thread(
        target=core.run, args=(lambda: emit(ready),), name=f"pace-engine-{name}", daemon=True
    )
    thread.start()
    while True:
        try:
            msg = cmd_conn.recv()
        except (EOFError, OSError):
            core.stop()
            break
        if isinstance(msg, Stop):
            core.stop()
            break
        core.inbox.put(msg)
    thread.join(30)


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def _child_env(**env: str) -> Iterator[None]:
    """``env`` in ``os.environ`` while a child is spawned (it inherits the environment; an
    OpenMP runtime reads ``OMP_NUM_THREADS`` when it loads, before any code of ours runs)."""
    with _ENV_LOCK:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


class ProcessEngine:
    """One engine instance in its own process, restarted when it dies; an
    :class:`~pace_core.server.launch.instances.EngineHandle`."""

    def __init__(
        self,
        name: str,
        model_args: dict[str, Any],
        config: EngineConfig,
        plan: InstancePlan,
        restart_delay: float = 0.5,
    ) -> None:
        self.name = name
        self.model_args = model_args
        self.config = config
        self.plan = plan
        self.restart_delay = restart_delay
        self.capacity_tokens: int | None = None
        self.block_size: int | None = None
        self.healthy = False
        self.failed: str | None = None
        self.pid: int | None = None
        self.restarts = 0
        self.early_deaths = 0  # processes in a row that died before their Ready
        self._deliver: Deliver | None = None
        self._send_lock = threading.Lock()
        self._closing = False
        self._proc: Any = None
        self._cmd: Any = None

    def start(self, deliver: Deliver) -> None:
        self._deliver = deliver
        log.info("instance %s: %s", self.name, self.plan.describe())
        self._spawn()

    def _spawn(self) -> None:
        ctx = mp.get_context("spawn")
        cmd_r, cmd_w = ctx.Pipe(duplex=False)
        evt_r, evt_w = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_instance_main,
            args=(self.name, self.model_args, self.config, self.plan, cmd_r, evt_w),
            name=f"pace-instance-{self.name}",
            daemon=True,
        )
        threads = self.config.threads or self.plan.omp_threads
        with _child_env(OMP_NUM_THREADS=str(max(1, threads))):
            proc.start()
        cmd_r.close()
        evt_w.close()
        with self._send_lock:
            self._proc, self._cmd = proc, cmd_w
        threading.Thread(
            target=self._read, args=(proc, evt_r), name=f"pace-reader-{self.name}", daemon=True
        ).start()

    def _read(self, proc: Any, conn: Any) -> None:
        served = False  # this process sent its Ready
        while True:
            try:
                events = conn.recv()
            except (EOFError, OSError):
                break
            if events and isinstance(events[0], Ready):
                ready = events[0]
                self.capacity_tokens, self.block_size = ready.capacity_tokens, ready.block_size
                self.pid = ready.pid
                self.healthy = served = True
            self._emit(events)
        conn.close()
        proc.join(5)
        self.early_deaths = 0 if served else self.early_deaths + 1
        self.healthy = False
        if self._closing:
            return
        reason = f"engine instance {self.name} stopped ({_exit_text(proc.exitcode)})"
        if self.early_deaths >= MAX_EARLY_DEATHS:
            self.failed = (
                f"{reason} before serving, {self.early_deaths} times in a row: not restarted "
                "(its error is in the log above)"
            )
            log.error("%s", self.failed)
            return
        log.error("%s; restarting it", reason)
        self._emit([Dead(f"{reason} with this request in flight; retry it")])
        time.sleep(self.restart_delay)
        if not self._closing:
            self.restarts += 1
            self._spawn()

    def _emit(self, events: list[Event]) -> None:
        if self._deliver is not None:
            self._deliver(events)

    def _send(self, msg: Command) -> None:
        with self._send_lock:
            self._cmd.send(msg)

    def submit(self, specs: list[SeqSpec]) -> None:
        self._send(Submit(specs))

    def cancel(self, keys: list[str]) -> None:
        with contextlib.suppress(OSError, ValueError):  # gone: its sequences went with it
            self._send(Cancel(keys))

    def wait_warm(self, timeout: float) -> bool:
        """True: the instance process warms up before its ``Ready``, and takes no request
        until then (``healthy`` is clear), so there is nothing to wait for here."""
        return True

    def kill(self) -> None:
        """Hard-kill the process (tests; the reader restarts it)."""
        if self._proc is not None:
            self._proc.kill()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._closing = True
        with contextlib.suppress(OSError, ValueError):
            self._send(Stop())
        if self._proc is not None:
            self._proc.join(timeout)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(5)
