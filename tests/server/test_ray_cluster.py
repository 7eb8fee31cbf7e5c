"""pace on a simulated two-node Ray cluster (``ray.cluster_utils.Cluster``, loopback): one
engine replica per node behind the ingress on the head; requests succeed and reach both
nodes. Needs ``ray[serve]`` (``make test-slow`` installs it)."""

from __future__ import annotations

import concurrent.futures as cf
import time

import pytest
import torch

from pace_core.engine.config import EngineConfig
from pace_core.server.frontdoor.context import ServerConfig

from .conftest import MODEL_NAME, client

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


def test_replicas_on_two_nodes_serve_one_endpoint(smollm2_dir):
    from pace_bench.serving_peers import free_port
    from ray import serve
    from ray.cluster_utils import Cluster
    from ray.util.state import list_actors

    from pace_core.server.launch.ray_serve import build_app

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]  # 1 replica fits each
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        args = {"model": str(smollm2_dir), "dtype": torch.float32, "max_cache_tokens": 1024,
                "kv_cache_type": "paged"}  # fmt: skip
        config = ServerConfig(served_model_name=MODEL_NAME)
        app = build_app(args, EngineConfig(max_running=4), config, replicas=2, threads=1)
        serve.run(app, name="pace", route_prefix="/")

        class Http:
            url = f"http://127.0.0.1:{port}"

        prompts = [f"Item {i} of the list is" for i in range(8)]
        c = client(Http())
        with cf.ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(lambda p: c.completions.create(
                model=MODEL_NAME, prompt=p, max_tokens=6, temperature=0), prompts))  # fmt: skip
        assert all(o.choices[0].text for o in outs)
        engines = [a for a in list_actors(filters=[("state", "=", "ALIVE")])
                   if "PaceEngine" in (a.class_name or "")]  # fmt: skip
        worker_ids = {n.node_id for n in nodes}
        assert {a.node_id for a in engines} == worker_ids  # one replica per worker node
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


def test_autoscaling_adds_a_replica_under_load(smollm2_dir):
    from pace_bench.serving_peers import free_port
    from ray import serve

    from pace_core.server.launch.ray_serve import build_app

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        args = {"model": str(smollm2_dir), "dtype": torch.float32, "max_cache_tokens": 2048,
                "kv_cache_type": "paged"}  # fmt: skip
        config = ServerConfig(served_model_name=MODEL_NAME)
        app = build_app(args, EngineConfig(max_running=2), config, min_replicas=1,
                        max_replicas=2, threads=1)  # fmt: skip
        serve.run(app, name="pace", route_prefix="/")

        def replicas() -> int:
            status = serve.status().applications["pace"].deployments["PaceEngine"]
            return status.replica_states.get("RUNNING", 0)

        assert replicas() == 1

        class Http:
            url = f"http://127.0.0.1:{port}"

        c = client(Http())

        def busy(i: int):
            return c.completions.create(model=MODEL_NAME, prompt=f"Story {i}:", max_tokens=300,
                                        temperature=0, extra_body={"ignore_eos": True})  # fmt: skip

        with cf.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(busy, i) for i in range(8)]
            deadline = time.monotonic() + 120
            while replicas() < 2 and time.monotonic() < deadline:
                time.sleep(2.0)
            scaled = replicas()
            for f in futures:
                f.result(timeout=600)
        assert scaled == 2  # 8 ongoing requests over a target of 1 per replica
    finally:
        serve.shutdown()
        ray.shutdown()
