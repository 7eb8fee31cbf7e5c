"""One of two engine processes killed mid-load: only its requests fail, the server stays up.

`pace serve --instances 2` as two real processes (SmolLM2), 8 requests in flight (4 streamed),
the engine process of instance 0 killed with SIGKILL: instance 1's requests finish in full,
instance 0's fail with a retryable 503 (an error payload mid-stream), new requests are served
by instance 1 while instance 0 restarts (``/health`` says degraded), and instance 0 takes
requests again once it is ready, its prefix-routing memory forgotten.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
from pathlib import Path

import httpx
import openai
import pytest

from pace_core.server.api.app import create_app
from pace_core.server.launch.testing import ThreadedServer

from .conftest import MODEL_NAME, two_instance_server, wait_for

TOKENS = 64
# distinct first 64-token blocks: no shared prefix, so routing is least-loaded (ties: lowest
# index) and request i lands on instance i % 2; long enough for the prefix router to record
PROMPT = "Note {i}: the committee met on Tuesday to review the budget and the plans. " * 8


@pytest.mark.slow  # 50-90 s here: three model loads in spawned processes on 2 cores
def test_a_killed_instance_fails_only_its_own_requests(smollm2_dir):
    server = two_instance_server(smollm2_dir, request_timeout=180)
    frontend = server.frontend
    victim, survivor = frontend.instances
    with ThreadedServer(create_app(server), timeout=60) as http:
        wait_for(lambda: victim.healthy and survivor.healthy, 240, "both instances ready")
        assert httpx.get(http.url + "/health").json()["status"] == "ok"
        for inst in frontend.instances:  # placed by its plan: pinned, OpenMP team sized
            assert os.sched_getaffinity(inst.pid) == set(inst.plan.cores)
            environ = Path(f"/proc/{inst.pid}/environ").read_bytes().split(b"\0")
            assert f"OMP_NUM_THREADS={inst.plan.omp_threads}".encode() in environ
        c = openai.OpenAI(base_url=http.url + "/v1", api_key="x", max_retries=0, timeout=180)

        def call(i: int, max_tokens: int = TOKENS, stream: bool = False):
            kw = {"model": MODEL_NAME, "prompt": PROMPT.format(i=i), "max_tokens": max_tokens}
            kw.update(temperature=0, extra_body={"ignore_eos": True})
            if not stream:
                out = c.completions.create(**kw)
                return out.usage.completion_tokens, out.choices[0].finish_reason
            usage = {"include_usage": True}
            chunks = list(c.completions.create(**kw, stream=True, stream_options=usage))
            finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1]
            return chunks[-1].usage.completion_tokens, finish

        # 8 requests in flight, 4 per instance, half of them streamed
        with cf.ThreadPoolExecutor(8) as pool:
            futures = []
            for i in range(8):
                futures.append(pool.submit(call, i, TOKENS, i % 4 < 2))
                wait_for(lambda n=i + 1: sum(frontend.outstanding) == n, 30, f"request {i} routed")
            assert frontend.outstanding == [4, 4]
            assert victim.pid != survivor.pid
            wait_for(
                lambda: all(s.sub.first_token for s in list(frontend._seqs.values())),
                60,
                "every request generating",
            )
            old_pid = victim.pid
            os.kill(old_pid, signal.SIGKILL)
            results = []
            for future in futures:
                try:
                    results.append(future.result(timeout=180))
                except openai.APIError as exc:
                    results.append(exc)

        for i, got in enumerate(results):
            streamed = i % 4 < 2
            if i % 2:  # instance 1: complete, full length
                assert got == (TOKENS, "length"), (i, got)
            elif streamed:  # headers were sent: an OpenAI error payload ends the stream
                assert isinstance(got, openai.APIError) and got.body["type"] == "engine_error"
                assert "engine instance 0 stopped (killed by SIGKILL)" in got.message
            else:
                assert isinstance(got, openai.APIStatusError), (i, got)
                assert got.status_code == 503 and got.response.headers["Retry-After"]
                assert got.body["type"] == "engine_error" and "retry it" in got.message

        # while instance 0 restarts: degraded, not down, and new requests are served
        health = httpx.get(http.url + "/health")
        assert health.status_code == 200
        assert health.json() == {"status": "degraded", "ready": 1, "instances": 2}
        assert 0 not in frontend.router.seen  # its prefix memory is gone with its cache
        with cf.ThreadPoolExecutor(3) as pool:
            during = list(pool.map(lambda i: call(100 + i, 4), range(3)))
        assert during == [(4, "length")] * 3
        assert not victim.healthy, "instance 0 restarted before the test could check"

        # instance 0 rejoins routing when its new process is ready
        wait_for(lambda: victim.healthy and victim.pid != old_pid, 240, "instance 0 restarted")
        assert victim.restarts == 1
        assert httpx.get(http.url + "/health").json()["status"] == "ok"
        with cf.ThreadPoolExecutor(2) as pool:
            first = pool.submit(call, 200, 32)
            wait_for(lambda: sum(frontend.outstanding) == 1, 30, "first request routed")
            second = pool.submit(call, 201, 32)
            wait_for(lambda: frontend.outstanding == [1, 1], 30, "one request per instance")
            assert first.result(timeout=120) == second.result(timeout=120) == (32, "length")


def test_an_instance_that_never_starts_is_given_up(tmp_path):
    """A process that dies before its Ready (here: a folder that is no model) is restarted at
    most twice, then left down with the reason, which ``/health`` shows (was: restarted
    forever, ``/health`` "starting")."""
    from pace_core.engine.config import EngineConfig
    from pace_core.platform.placement import InstancePlan
    from pace_core.server.frontdoor.frontend import Frontend
    from pace_core.server.frontdoor.metrics import Metrics
    from pace_core.server.launch.multi import MAX_EARLY_DEATHS, ProcessEngine

    engine = ProcessEngine("0", {"model": str(tmp_path)}, EngineConfig(),
                           InstancePlan((0,), None, 1), restart_delay=0.01)  # fmt: skip
    frontend = Frontend([engine], Metrics(), max_running=4, max_queue=8)
    engine.start(lambda events: None)
    try:
        wait_for(lambda: engine.failed is not None, 180, "the instance given up")
    finally:
        engine.shutdown()
    assert engine.restarts == MAX_EARLY_DEATHS - 1
    assert f"before serving, {MAX_EARLY_DEATHS} times in a row: not restarted" in engine.failed
    health = frontend.readiness()
    assert health["status"] == "failed" and health["error"] == engine.failed
