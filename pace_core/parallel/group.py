"""Rank 0's side of a tensor-parallel group: start ranks 1..N-1 as processes, connect, watch
them, stop them.

A rank > 0 is ``python -m pace_core.parallel.worker`` with its arguments pickled on its
stdin, which stays open: the rank exits when it reads EOF, that is when rank 0's process is
gone, so no rank outlives its group. Each rank pins itself to its plan's cores (rank 0 too,
with ``bind``), prefers its node's memory and sizes its OpenMP team before it loads its
shard. When a rank dies, rank 0's next collective fails (:class:`RankFailure`); with
``exit_on_failure`` (a served instance) rank 0's process ends at once, so its supervisor
fails its requests and restarts the group.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import pickle
import secrets
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pace_core.parallel.comm import Comm, RankFailure, joined_key
from pace_core.parallel.config import TensorParallelConfig
from pace_core.parallel.shm import create_segment, segment_path
from pace_core.platform.placement import InstancePlan

log = logging.getLogger("pace.parallel")

CONNECT_TIMEOUT = 300.0  # seconds for every rank to join (a rank imports torch first)


@dataclass(frozen=True)
class WorkerArgs:
    """What a rank > 0 needs to load its shard and join the group."""

    rank: int
    size: int
    port: int
    plan: InstancePlan
    bind: bool
    model: dict[str, Any]  # path, dtype, kv_cache_type, opconfig, quantization, strict
    shm: Path | None = None  # the shared-memory segment of the all-reduce


class RankGroup:
    """Ranks 1..N-1 of rank 0's group (rank 0 is this process)."""

    def __init__(self, config: TensorParallelConfig, model: dict[str, Any]) -> None:
        self.config = config
        self.plans = list(config.rank_plans())
        self.closing = False
        self.procs: list[subprocess.Popen] = []
        store = dist.TCPStore(
            "127.0.0.1", 0, config.size, True,
            timeout=datetime.timedelta(seconds=CONNECT_TIMEOUT), wait_for_workers=False,
        )  # fmt: skip
        shm = None
        if config.all_reduce == "shm":
            shm = segment_path(secrets.token_hex(4))
            create_segment(shm, config.size)
        for rank in range(1, config.size):
            args = WorkerArgs(rank, config.size, store.port, self.plans[rank], config.bind,
                              model, shm)  # fmt: skip
            self.procs.append(self._spawn(args))
        self._finalizer = weakref.finalize(self, _stop, list(self.procs))
        if config.bind:
            bind_rank(self.plans[0], 0)
        try:
            self._wait_joined(store)
            self.comm = Comm(0, config.size, store=store, shm=shm)
        finally:
            if shm is not None:  # every rank mapped it (or failed): the name can go
                shm.unlink(missing_ok=True)
        for rank, proc in enumerate(self.procs, start=1):
            threading.Thread(
                target=self._watch, args=(rank, proc), name=f"pace-tp-watch-{rank}", daemon=True
            ).start()
        log.info(
            "tensor parallel: %d ranks: %s", config.size,
            "; ".join(f"rank {r}: {p.describe()}" for r, p in enumerate(self.plans)),
        )  # fmt: skip

    def _wait_joined(self, store: dist.Store) -> None:
        """Until every rank is about to join; RankFailure when one exits first (a rank that
        cannot start would otherwise leave rank 0 waiting for the store's timeout)."""
        keys = [joined_key(rank) for rank in range(1, self.config.size)]
        deadline = time.monotonic() + CONNECT_TIMEOUT
        while not store.check(keys):
            for rank, proc in enumerate(self.procs, start=1):
                if proc.poll() is not None:
                    _stop(self.procs)
                    raise RankFailure(
                        f"tensor-parallel rank {rank} exited while starting "
                        f"({_exit_text(proc.returncode)}); its error is in the log above"
                    )
            if time.monotonic() > deadline:
                _stop(self.procs)
                raise RankFailure(f"tensor-parallel ranks did not start in {CONNECT_TIMEOUT} s")
            time.sleep(0.05)

    def _spawn(self, args: WorkerArgs) -> subprocess.Popen:
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, args.plan.omp_threads))}
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        proc = subprocess.Popen(
            [sys.executable, "-m", "pace_core.parallel.worker"], stdin=subprocess.PIPE, env=env
        )
        data = pickle.dumps(args)
        proc.stdin.write(len(data).to_bytes(8, "little") + data)
        proc.stdin.flush()
        return proc

    def _watch(self, rank: int, proc: subprocess.Popen) -> None:
        code = proc.wait()
        if self.closing:
            return
        reason = f"tensor-parallel rank {rank} (pid {proc.pid}) exited ({_exit_text(code)})"
        self.comm.failure = self.comm.failure or f"{reason}; load the model again"
        if self.config.exit_on_failure:
            log.error("%s: ending this instance so that its group restarts", reason)
            os._exit(75)
        log.error("%s: this model cannot run again; load it anew", reason)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def close(self) -> None:
        """Stop the other ranks (idempotent)."""
        if self.closing:
            return
        self.closing = True
        if self.comm.failure is None:
            try:
                self.comm.send_stop()
            except Exception:  # a rank is gone already
                log.debug("tensor parallel: stop not delivered", exc_info=True)
        self._finalizer()
        self.comm.close()


def bind_rank(plan: InstancePlan, rank: int) -> None:
    """Pin this process (a rank) as its instance plan says, with its thread count."""
    from pace_core.platform.binding import apply_plan

    apply_plan(plan, f"tensor-parallel rank {rank}")
    torch.set_num_threads(max(1, plan.omp_threads))


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.stdin is not None and not proc.stdin.closed:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # the rank exits at EOF
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _exit_text(code: int) -> str:
    import signal

    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
