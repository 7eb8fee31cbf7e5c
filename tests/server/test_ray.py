"""pace on Ray Serve, on a local Ray cluster (loopback only): two engine replicas of SmolLM2
behind the OpenAI ingress. Greedy outputs equal ``pace serve``'s under 16 concurrent
requests (streamed too), bad input is a 400 in the OpenAI shape, metrics carry a label per
replica, and a replica killed mid-run fails its requests with a retryable 503 while later
requests succeed. Needs ``ray[serve]`` (``make test-slow`` installs it)."""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import pytest
import torch

from pace_core.engine.config import EngineConfig
from pace_core.server.frontdoor.context import ServerConfig

from .conftest import MODEL_NAME, client, serve

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

PROMPTS = [f"Question {i}: what is {i} plus {i}? The answer is" for i in range(16)]


@pytest.fixture(scope="module")
def ray_app(smollm2_dir):
    from pace_bench.serving_peers import free_port
    from ray import serve

    from pace_core.server.launch.ray_serve import build_app

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    model_args = {
        "model": str(smollm2_dir), "dtype": torch.float32, "kv_cache_type": "paged",
        "max_cache_tokens": 2048,
    }  # fmt: skip
    app = build_app(
        model_args, EngineConfig(max_running=8), ServerConfig(served_model_name=MODEL_NAME),
        replicas=2, threads=1,
    )  # fmt: skip
    serve.run(app, name="pace", route_prefix="/")

    class Http:
        url = f"http://127.0.0.1:{port}"

    yield Http()
    serve.shutdown()
    ray.shutdown()


def _complete(http, prompt: str, stream: bool = False) -> str:
    c = client(http)
    kw = dict(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0)
    if not stream:
        return c.completions.create(**kw).choices[0].text
    return "".join(
        ch.choices[0].text for ch in c.completions.create(stream=True, **kw) if ch.choices
    )


@pytest.fixture(scope="module")
def expected(llm):
    with serve(llm) as http:
        return [_complete(http, p) for p in PROMPTS]


def test_greedy_outputs_equal_pace_serve_under_16_concurrent_requests(ray_app, expected):
    with cf.ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda p: _complete(ray_app, p), PROMPTS))
        streamed = list(pool.map(lambda p: _complete(ray_app, p, stream=True), PROMPTS))
    assert got == expected
    assert streamed == expected


def test_replicas_are_pinned_to_cores_of_their_own(ray_app):
    from ray import serve

    handle = serve.get_deployment_handle("PaceEngine", app_name="pace")
    sets = {tuple(handle.cores.remote().result()) for _ in range(24)}  # reaches both replicas
    assert len(sets) == 2 and all(len(s) == 1 for s in sets), sets
    assert not set(sets.pop()) & set(sets.pop())


def test_bad_input_is_a_400_and_metrics_label_replicas(ray_app):
    r = httpx.post(ray_app.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = httpx.post(ray_app.url + "/v1/completions", json={"prompt": "a", "max_tokens": 0})
    assert r.status_code == 400
    text = httpx.get(ray_app.url + "/metrics").text
    labels = {
        line.split('instance="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("pace_generation_tokens_total{")
    }
    assert len(labels - {"ray"}) == 2, labels  # one series per replica


def test_a_killed_replica_fails_its_requests_retryably_and_the_service_recovers(ray_app):
    from ray import serve

    status = serve.status().applications["pace"].deployments["PaceEngine"]
    assert status.status == "HEALTHY"
    actors = [a for a in ray.util.list_named_actors(all_namespaces=True)
              if "PaceEngine" in a["name"]]  # fmt: skip
    assert len(actors) == 2
    victim = ray.get_actor(actors[0]["name"], namespace=actors[0]["namespace"])
    c = client(ray_app)

    def long_request(i: int):
        try:
            return c.completions.create(
                model=MODEL_NAME,
                prompt=PROMPTS[i],
                max_tokens=200,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
        except Exception as exc:  # the killed replica's requests
            return exc

    with cf.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(long_request, i) for i in range(6)]
        time.sleep(2.0)
        ray.kill(victim, no_restart=False)
        results = [f.result(timeout=120) for f in futures]
    failed = [r for r in results if isinstance(r, Exception)]
    assert all(getattr(r, "status_code", None) == 503 for r in failed), failed
    assert len(failed) < len(results)  # the other replica's requests finished
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # Ray replaces the replica; requests succeed again
        try:
            outs = [_complete(ray_app, p) for p in PROMPTS[:4]]
            break
        except Exception:
            time.sleep(2.0)
    else:
        pytest.fail("the service did not recover within 120 s")
    assert all(outs)


def test_requests_sharing_a_prefix_land_on_the_replica_that_cached_it(ray_app):
    shared = "Background: " + "the river flows past the old mill and the bridge. " * 40
    c = client(ray_app)
    cached = []
    for i in range(6):
        out = c.completions.create(
            model=MODEL_NAME, prompt=f"{shared}Question {i}:", max_tokens=2, temperature=0
        )
        cached.append(out.usage.prompt_tokens_details.cached_tokens)
    assert cached[0] == 0 and all(n >= 256 for n in cached[1:]), cached


def test_prefix_affinity_router_ranks_the_holder_first_within_the_slack():
    from pace_core.engine.events import SeqSpec
    from pace_core.sampling import SamplingConfig
    from pace_core.server.launch.ray_serve import PrefixAffinityRouter

    class Replica:
        def __init__(self, rid):
            self.replica_id = rid

    class Pending:
        def __init__(self, prompt):
            self.args = [[SeqSpec("k", prompt, SamplingConfig())]]

    router = PrefixAffinityRouter.__new__(PrefixAffinityRouter)
    router.initialize_state(slack=2)
    loads: dict[str, int] = {"a": 0, "b": 0}
    router._replica_queue_len_cache = loads
    a, b = Replica("a"), Replica("b")
    prompt = list(range(300))
    import asyncio

    ranks = asyncio.run(router.choose_replicas([a, b], Pending(prompt)))
    assert ranks == [[a, b]]  # nothing cached anywhere: Ray probes both
    router.on_request_routed(Pending(prompt), "b", None)
    assert asyncio.run(router.choose_replicas([a, b], Pending(prompt)))[0] == [b]
    loads["b"] = 3
    assert asyncio.run(router.choose_replicas([a, b], Pending(prompt))) == [[a, b]]


def test_a_choice_a_stop_string_ended_leaves_the_others_streaming():
    """The front door cancels a sequence a stop string ended; on Ray the request's streaming
    call carries all its choices, so it ends only once every unfinished one is cancelled."""
    import asyncio
    import contextlib

    from pace_core.engine.events import SeqSpec, Token
    from pace_core.sampling.config import SamplingConfig
    from pace_core.server.launch.ray_serve import RayEngines

    class Calls:
        def __init__(self):
            self.closed = False

        def options(self, stream):
            return self

        @property
        def submit(self):
            return self

        async def remote(self, specs):
            try:
                for t in range(6):
                    await asyncio.sleep(0.01)
                    yield "replica", [Token(s.key, t, "", "length" if t == 3 and s.key == "b"
                                            else None) for s in specs]  # fmt: skip
            finally:
                self.closed = True

    async def scenario(cancel_both: bool):
        calls, got = Calls(), []
        engines = RayEngines(calls)
        engines.start(lambda events, replica=None: got.extend(events))
        cfg = SamplingConfig(max_new_tokens=6)
        engines.submit([SeqSpec("a", [1], cfg), SeqSpec("b", [1], cfg)])
        task = engines._tasks["a"]
        while not got:
            await asyncio.sleep(0.005)
        engines.cancel(["a", "b"] if cancel_both else ["a"])  # "a" hit a stop string
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return got, engines, calls

    got, engines, calls = asyncio.run(scenario(cancel_both=False))
    assert [e.token for e in got if e.key == "b"] == [0, 1, 2, 3]  # b ran to its end
    assert not any(e.key == "a" and e.token > 3 for e in got)  # then the call ended
    assert calls.closed and not engines._tasks and not engines._cancelled
    got, engines, calls = asyncio.run(scenario(cancel_both=True))
    assert max(e.token for e in got) < 3 and calls.closed and not engines._tasks
