"""A tensor-parallel group whose rank 1 dies: its requests fail with a retryable 503, the
group restarts and serves again.

``pace serve --tensor-parallel 2`` over a tiny random Llama (two ranks of one thread, each
pinned to its plan's core), 4 requests in flight (2 streamed), rank 1's process killed with
SIGKILL: rank 0's process ends too (its supervisor sees the instance stop), every in-flight
request fails with a retryable 503 (an error payload mid-stream), ``/health`` is 503 while
the group restarts, and the new group (new processes, both ranks) serves the next requests.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
from pathlib import Path

import httpx
import openai
import pytest
from support.spec_models import save_llama

from pace_core.engine.config import EngineConfig
from pace_core.platform import current_topology
from pace_core.server.api.app import ServerConfig, create_app
from pace_core.server.launch.tensor_parallel import plan_groups, tensor_parallel_server
from pace_core.server.launch.testing import ThreadedServer

from .conftest import wait_for

TOKENS = 200
PROMPT = "w1 w2 w3 w4 w5 w6 w7 w{i}"


def _ranks(leader: int) -> list[int]:
    """The pids of the tensor-parallel ranks rank 0 (``leader``) started."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == leader and b"pace_core.parallel.worker" in cmd:
            out.append(int(entry.name))
    return out


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two ranks need two cores")
def test_a_dead_rank_fails_its_groups_requests_and_the_group_restarts(tmp_path, word_tokenizer):
    path = save_llama(tmp_path / "llama")
    word_tokenizer.save_pretrained(path)
    groups = plan_groups(current_topology(), 2)
    server = tensor_parallel_server(
        {"model": str(path), "dtype": "float32", "kv_cache_type": "paged"},
        groups,
        EngineConfig(max_running=8, max_queue=16),
        ServerConfig(served_model_name="tiny", request_timeout=120),
    )
    (group,) = server.frontend.instances
    with ThreadedServer(create_app(server), timeout=60) as http:
        wait_for(lambda: group.healthy, 180, "the group ready")
        wait_for(lambda: len(_ranks(group.pid)) == 1, 30, "rank 1 listed")
        (rank1,) = _ranks(group.pid)
        for pid, plan in zip((group.pid, rank1), groups[0]):  # each rank pinned to its plan
            assert os.sched_getaffinity(pid) == set(plan.cores)
        c = openai.OpenAI(base_url=http.url + "/v1", api_key="x", max_retries=0, timeout=120)

        def call(i: int, max_tokens: int = TOKENS, stream: bool = False):
            kw = {"model": "tiny", "prompt": PROMPT.format(i=i), "max_tokens": max_tokens}
            kw.update(temperature=0, extra_body={"ignore_eos": True})
            if not stream:
                out = c.completions.create(**kw)
                return out.usage.completion_tokens, out.choices[0].finish_reason
            chunks = list(c.completions.create(**kw, stream=True))
            return len(chunks), chunks[-1].choices[0].finish_reason

        assert call(0, 8) == (8, "length")
        with cf.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(call, i, TOKENS, i < 2) for i in range(4)]
            wait_for(
                lambda: (
                    len(server.frontend._seqs) == 4
                    and all(s.sub.first_token for s in list(server.frontend._seqs.values()))
                ),
                60,
                "every request generating",
            )
            old = group.pid
            os.kill(rank1, signal.SIGKILL)
            results = []
            for future in futures:
                try:
                    results.append(future.result(timeout=120))
                except openai.APIError as exc:
                    results.append(exc)
        for i, got in enumerate(results):
            assert isinstance(got, openai.APIError), (i, got)
            assert "engine instance 0 stopped" in got.message
            if i >= 2:  # not streamed: a 503 asking for a retry
                assert isinstance(got, openai.APIStatusError) and got.status_code == 503
                assert got.response.headers["Retry-After"]
        assert httpx.get(http.url + "/health").status_code == 503  # the only group restarts

        wait_for(lambda: group.healthy and group.pid != old, 180, "the group restarted")
        assert group.restarts == 1
        assert not Path(f"/proc/{rank1}").exists() or rank1 not in _ranks(old)
        wait_for(lambda: len(_ranks(group.pid)) == 1, 30, "the new rank 1 listed")
        assert httpx.get(http.url + "/health").json()["status"] == "ok"
        assert call(50, 16) == (16, "length")
