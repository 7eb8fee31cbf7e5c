"""`pace serve` exits with status 1 once every engine instance has given up (was: it kept
running, every request and ``/health`` a 503, forever), and serves on while any instance is
healthy or may still restart."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.fake_instances import FakeInstance

from pace_core.server.frontdoor.frontend import Frontend
from pace_core.server.frontdoor.metrics import Metrics
from pace_core.server.launch.process import EXIT_GAVE_UP, serve_http


async def app(scope, receive, send):  # the smallest ASGI app uvicorn will run
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})


def frontend(*instances: FakeInstance) -> Frontend:
    return Frontend(list(instances), Metrics(), max_running=4, max_queue=8)


def test_gave_up_only_when_every_instance_has():
    up, down = FakeInstance("0"), FakeInstance("1", healthy=False, failed="no model here")
    assert frontend(up, down).gave_up is None  # one serves
    restarting = FakeInstance("0", healthy=False)  # down, but it may come back
    assert frontend(restarting, down).gave_up is None
    assert frontend(restarting, down).readiness()["status"] == "starting"
    gone = FakeInstance("0", healthy=False, failed="killed before serving, 3 times")
    assert frontend(gone, down).gave_up == "killed before serving, 3 times"
    health = frontend(gone, down).readiness()
    assert health == {"status": "failed", "ready": 0, "instances": 2, "error": gone.failed}


def test_serve_http_exits_1_when_every_instance_gives_up(caplog):
    instance = FakeInstance("0", healthy=False)
    front = frontend(instance)

    def give_up() -> None:
        time.sleep(0.5)
        instance.failed = "engine instance 0 stopped before serving"

    threading.Thread(target=give_up, daemon=True).start()
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="pace.server"):
        status = serve_http(app, front, "127.0.0.1", 0, "warning", interval=0.05)
    assert status == EXIT_GAVE_UP == 1
    assert time.monotonic() - started < 30
    assert "every engine instance has given up" in caplog.text
    assert "engine instance 0 stopped before serving" in caplog.text


def test_serve_http_exits_0_on_ctrl_c_while_an_instance_serves():
    """SIGINT stops the server cleanly, status 0 (uvicorn re-raises it once shut down), and a
    healthy instance is never taken for one that gave up."""
    front = frontend(FakeInstance("0"), FakeInstance("1", healthy=False, failed="gone"))

    def interrupt() -> None:
        time.sleep(1.0)  # uvicorn's handlers are in place well before this
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    assert serve_http(app, front, "127.0.0.1", 0, "warning", interval=0.05) == 0


@pytest.mark.slow  # three failed starts of two spawned instance processes: ~20-40 s here
def test_pace_serve_exits_when_no_instance_can_load(tmp_path, smollm2_dir):
    """`pace serve --instances 2` on SmolLM2's config and tokenizer without its weights: the
    server starts (the tokenizer loads in its own process), each instance process dies
    before it is ready, is restarted twice and given up, and the server process exits 1."""
    for path in Path(smollm2_dir).iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy(path, tmp_path / path.name)
    proc = subprocess.run(
        [sys.executable, "-m", "pace_core.cli", "--log-level", "warning", "serve",
         str(tmp_path), "--instances", "2", "--port", "0"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == EXIT_GAVE_UP, proc.stderr[-3000:]
    assert "every engine instance has given up" in proc.stderr
    assert "not restarted" in proc.stderr
