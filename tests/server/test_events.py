"""The typed messages between front door and engines: they pickle (engine processes send
them through pipes), and both engine instance kinds are :class:`EngineHandle` s."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import pytest

from pace_core.engine.config import EngineConfig
from pace_core.engine.events import (
    Admitted,
    Cancel,
    ErrorKind,
    PromptLogprobs,
    SeqError,
    SeqSpec,
    SpecStep,
    Stats,
    Stop,
    Submit,
    Token,
)
from pace_core.engine.output import TokenLogprob
from pace_core.platform.placement import InstancePlan
from pace_core.sampling.config import SamplingConfig
from pace_core.server.launch.instances import Dead, EngineHandle, Ready
from pace_core.server.launch.multi import ProcessEngine

SPEC = SeqSpec("r:0", [1, 2, 3], SamplingConfig(max_new_tokens=4, seed=7), arrival=1.5)
MESSAGES = [
    Submit([SPEC]),
    Cancel(["r:0", "r:1"]),
    Stop(),
    Admitted("r:0", 0.25),
    Token("r:0", 42, " hi", None),
    Token("r:0", 7, "", "stop", -0.5, [7, 9], [-0.5, -1.25]),
    SpecStep("r:0", 4, 3, 4),
    PromptLogprobs("r:0", [None, TokenLogprob(5, -1.5, {5: -1.5, 9: -2.0})]),
    SeqError("r:0", "boom", ErrorKind.ENGINE_ERROR),
    Stats(2, 1, 0.5, 0.75),
    Ready(2048, 16, 1234),
    Dead("engine 0 stopped"),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_messages_pickle(msg):
    assert pickle.loads(pickle.dumps(msg)) == msg


def test_event_batches_cross_a_spawn_pipe():
    """What an engine process sends up (a batch per iteration) and down (commands)."""
    r, w = mp.get_context("spawn").Pipe(duplex=False)
    try:
        w.send(MESSAGES)
        got = r.recv()
    finally:
        r.close()
        w.close()
    assert got == MESSAGES and [type(m) for m in got] == [type(m) for m in MESSAGES]
    assert got[0].specs[0].reserve_tokens == 7


def test_stats_default_is_idle():
    assert Stats() == Stats(0, 0, 0.0, 0.0)


def test_both_instance_kinds_are_engine_handles(server):
    local = server.server_state.frontend.instances[0]
    plan = InstancePlan((0,), None, 1)
    process = ProcessEngine("p", {"model": "unused"}, EngineConfig(), plan)  # never started
    assert isinstance(local, EngineHandle) and isinstance(process, EngineHandle)
    assert process.capacity_tokens is None and not process.healthy
