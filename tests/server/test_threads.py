"""Model loading for serving runs on a thread that ends (pace_core.server.launch.threads): the
OpenMP team it creates must not outlive it, or the engine thread's OpenMP workers fall back
to libgomp's throttled spin (a futex wake-up per parallel region)."""

from __future__ import annotations

import argparse
import threading

import pytest

from pace_core.server.launch import cli
from pace_core.server.launch.threads import on_transient_thread


def test_returns_the_value_from_a_thread_that_has_ended():
    seen: list[threading.Thread] = []

    def work() -> int:
        seen.append(threading.current_thread())
        return 42

    assert on_transient_thread(work, name="loader") == 42
    (thread,) = seen
    assert thread is not threading.main_thread() and thread.name == "loader"
    assert not thread.is_alive()


def test_reraises_what_the_call_raised():
    def fail() -> None:
        raise ValueError("bad model")

    with pytest.raises(ValueError, match="bad model"):
        on_transient_thread(fail)


def test_pace_serve_loads_the_model_off_the_main_thread(monkeypatch):
    """build_server loads through on_transient_thread, and the loading thread has ended
    before the engine thread starts."""
    loads: list[threading.Thread] = []

    class Loaded(Exception):
        pass

    def fake_llm(**kwargs):
        loads.append(threading.current_thread())
        raise Loaded  # stop before Server.in_process: no model needed for this check

    monkeypatch.setattr("pace_core.engine.llm.LLMModel", fake_llm)
    parser = argparse.ArgumentParser(prog="pace")
    cli.add_serve_parser(parser.add_subparsers(dest="command", required=True))
    with pytest.raises(Loaded):
        cli.build_server(parser.parse_args(["serve", "some-model"]))
    (thread,) = loads
    assert thread is not threading.main_thread() and not thread.is_alive()
