"""Multi-instance serving: engine processes with partitioned cores behind one front door.

Each instance is a ``spawn``-ed process that loads the model, pins itself to its cores
(``os.sched_setaffinity``) and runs an :class:`~pace_core.engine.core.EngineCore` with
``torch.set_num_threads(len(cores))``. The front door talks to it over two one-way pipes:
commands (:class:`~pace_core.engine.events.Submit` / ``Cancel`` / ``Stop``) down, event
batches (:mod:`pace_core.engine.events`, a
:class:`~pace_core.server.launch.instances.Ready` first) up.
A reader thread per instance forwards events to the front door; when the pipe breaks (the
process died) the instance reports :class:`~pace_core.server.launch.instances.Dead` -- the
front door
fails that instance's in-flight requests -- and a new process is spawned. The child exits by
itself when the parent's end of the command pipe closes, so no orphan outlives the server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing as mp
import os
import threading
import time
from typing import Any

from pace_core.engine.config import EngineConfig
from pace_core.engine.core import EngineCore
from pace_core.engine.events import Cancel, Command, SeqSpec, Stop, Submit
from pace_core.server.launch.instances import Dead, Deliver, Event, Ready
from pace_core.server.launch.threads import on_transient_thread

log = logging.getLogger("pace.server.multi")


def partition_cores(instances: int, cores: list[int] | None = None) -> list[list[int]]:
    """Split the usable cores into ``instances`` contiguous, disjoint groups (>= 1 core each;
    with fewer cores than instances the groups wrap around and share)."""
    if cores is None:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        cores = cores or list(range(os.cpu_count() or 1))
    if instances <= len(cores):
        size, extra = divmod(len(cores), instances)
        out, start = [], 0
        for i in range(instances):
            n = size + (1 if i < extra else 0)
            out.append(cores[start : start + n])
            start += n
        return out
    return [[cores[i % len(cores)]] for i in range(instances)]


def _instance_main(
    name: str,
    model_args: dict[str, Any],
    config: EngineConfig,
    cores: list[int],
    cmd_conn: Any,
    evt_conn: Any,
) -> None:
    """Body of an instance process."""
    import torch

    from pace_core.engine.llm import LLMModel

    if cores and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, cores)
        except OSError as exc:
            log.warning("instance %s: cannot pin to cores %s: %s", name, cores, exc)
    threads = config.threads or max(1, len(cores))
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


class ProcessEngine:
    """One engine instance in its own process, restarted when it dies; an
    :class:`~pace_core.server.launch.instances.EngineHandle`."""

    def __init__(
        self,
        name: str,
        model_args: dict[str, Any],
        config: EngineConfig,
        cores: list[int],
        restart_delay: float = 0.5,
    ) -> None:
        self.name = name
        self.model_args = model_args
        self.config = config
        self.cores = cores
        self.restart_delay = restart_delay
        self.capacity_tokens: int | None = None
        self.block_size: int | None = None
        self.healthy = False
        self.pid: int | None = None
        self.restarts = 0
        self._deliver: Deliver | None = None
        self._send_lock = threading.Lock()
        self._closing = False
        self._proc: Any = None
        self._cmd: Any = None

    def start(self, deliver: Deliver) -> None:
        self._deliver = deliver
        self._spawn()

    def _spawn(self) -> None:
        ctx = mp.get_context("spawn")
        cmd_r, cmd_w = ctx.Pipe(duplex=False)
        evt_r, evt_w = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_instance_main,
            args=(self.name, self.model_args, self.config, self.cores, cmd_r, evt_w),
            name=f"pace-instance-{self.name}",
            daemon=True,
        )
        proc.start()
        cmd_r.close()
        evt_w.close()
        with self._send_lock:
            self._proc, self._cmd = proc, cmd_w
        threading.Thread(
            target=self._read, args=(proc, evt_r), name=f"pace-reader-{self.name}", daemon=True
        ).start()

    def _read(self, proc: Any, conn: Any) -> None:
        while True:
            try:
                events = conn.recv()
            except (EOFError, OSError):
                break
            if events and isinstance(events[0], Ready):
                ready = events[0]
                self.capacity_tokens, self.block_size = ready.capacity_tokens, ready.block_size
                self.pid = ready.pid
                self.healthy = True
            self._emit(events)
        conn.close()
        proc.join(5)
        self.healthy = False
        if self._closing:
            return
        reason = f"engine instance {self.name} stopped (exit code {proc.exitcode})"
        log.error("%s; restarting it", reason)
        self._emit([Dead(reason)])
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
