"""Multi-instance: engine processes with partitioned cores behind one front door."""

from __future__ import annotations

import concurrent.futures as cf

import httpx
import openai
import pytest

from pace_core.server.api.app import create_app
from pace_core.server.launch.testing import ThreadedServer

from .conftest import MODEL_NAME, two_instance_server, wait_for


@pytest.mark.slow  # 40-70 s here: three model loads in spawned processes
def test_two_instances_survive_a_crash(smollm2_dir):
    server = two_instance_server(smollm2_dir, request_timeout=120)
    instances = server.frontend.instances
    with ThreadedServer(create_app(server), timeout=60) as http:
        wait_for(lambda: all(i.healthy for i in instances), 240, "both instances ready")
        assert httpx.get(http.url + "/health").status_code == 200
        c = openai.OpenAI(base_url=http.url + "/v1", api_key="x", max_retries=0, timeout=120)

        def call(i, max_tokens=6, **kw):
            return c.completions.create(
                model=MODEL_NAME,
                prompt=f"Count to {i}:",
                max_tokens=max_tokens,
                temperature=0,
                **kw,
            )

        # concurrent requests spread over both instances and agree with each other
        with cf.ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(call, [3, 3, 3, 3]))
        assert len({o.choices[0].text for o in outs}) == 1
        assert server.metrics.render().count(b'pace_generation_tokens_total{instance="1"}') == 1
        text = server.metrics.render().decode()
        for name in ("0", "1"):
            line = next(
                x
                for x in text.splitlines()
                if x.startswith(f'pace_generation_tokens_total{{instance="{name}"}}')
            )
            assert float(line.split()[-1]) > 0, f"instance {name} served nothing"

        # a long request lands on instance 0 (both idle: lowest index), then it is killed
        victim = instances[0]
        old_pid = victim.pid
        with cf.ThreadPoolExecutor(1) as pool:
            doomed = pool.submit(call, 1, 2000, extra_body={"ignore_eos": True})
            wait_for(lambda: server.frontend.outstanding[0] > 0, 30, "request on instance 0")
            victim.kill()
            with pytest.raises(openai.APIStatusError) as err:
                doomed.result(timeout=60)
        assert err.value.status_code == 503
        # new requests succeed meanwhile (instance 1) and after the restart
        assert call(5).choices[0].text
        wait_for(lambda: victim.healthy and victim.pid != old_pid, 240, "instance 0 restarted")
        assert victim.restarts == 1
        with cf.ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(call, [4, 4, 4, 4]))
        assert all(o.choices[0].text for o in outs)

        # cache-aware routing: requests sharing a long prefix go where it is cached. A long
        # request occupies instance 0 (idle ties go to the lowest index), so the first shared
        # prompt is computed on instance 1; once both are idle again, least-loaded routing
        # would pick instance 0, the prefix router picks instance 1 (a cache hit).
        shared = "Notes: " + "the committee met on Tuesday to review the budget. " * 30

        def ask(i):
            out = c.completions.create(
                model=MODEL_NAME, prompt=f"{shared}Item {i}:", max_tokens=2, temperature=0
            )
            return out.usage.prompt_tokens_details.cached_tokens

        with cf.ThreadPoolExecutor(1) as pool:
            busy = pool.submit(call, 2, 200, extra_body={"ignore_eos": True})
            wait_for(lambda: server.frontend.outstanding[0] > 0, 30, "request on instance 0")
            first = ask(0)
            busy.result(timeout=120)
        wait_for(lambda: not any(server.frontend.outstanding), 30, "both instances idle")
        assert first == 0
        assert all(ask(i) >= 256 for i in range(1, 4))
