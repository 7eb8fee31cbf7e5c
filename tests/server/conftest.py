"""Server fixtures: the real SmolLM2 loaded once, in-process servers on free 127.0.0.1 ports."""

from __future__ import annotations

import contextlib
import importlib.util
import threading
import time

import pytest
import torch

# the tiny target / draft pairs of the speculative tests
from support.spec_fixtures import (  # noqa: F401  (fixtures of test_spec_serving.py)
    draft_dir,
    pard_dir,
    self_pard_dir,
    target_dir,
    word_tokenizer,
)

from pace_core.engine.llm import LLMModel

_DEPS = ("fastapi", "uvicorn", "prometheus_client", "openai", "httpx")
MISSING = [m for m in _DEPS if importlib.util.find_spec(m) is None]
if MISSING:  # the serve/test extras are not installed: skip the server tests
    collect_ignore_glob = ["test_*.py"]
else:
    import openai

    from pace_core.engine.config import EngineConfig
    from pace_core.server.api.app import Server, ServerConfig, create_app
    from pace_core.server.launch.testing import ThreadedServer

MODEL_NAME = "smollm2"
CACHE_TOKENS = 2048
# One engine thread on one core: a 2-thread OpenMP pool stalls badly on a busy 2-core machine.
THREADS = 1


@pytest.fixture(scope="session")
def llm(smollm2_dir):
    return LLMModel(
        smollm2_dir,
        dtype=torch.float32,
        kv_cache_type="paged",
        max_cache_tokens=CACHE_TOKENS,
        quiet=True,
    )


@contextlib.contextmanager
def serve(llm, *, engine: dict | None = None, **server_kw):
    """An in-process server (engine thread + uvicorn thread) on a free port."""
    engine_cfg = EngineConfig(**{"threads": THREADS, **(engine or {})})
    cfg = ServerConfig(served_model_name=MODEL_NAME, **server_kw)
    server = Server.in_process(llm, engine_cfg, cfg)
    with ThreadedServer(create_app(server)) as http:
        http.server_state = server
        yield http


def two_instance_server(model_dir, request_timeout: float):
    """``pace serve --instances 2`` over SmolLM2 fp32 (not started: the app's lifespan
    spawns the engine processes)."""
    model_args = {
        "model": str(model_dir),
        "dtype": "float32",
        "kv_cache_type": "paged",
        "max_cache_tokens": CACHE_TOKENS,
    }
    return Server.multi_instance(
        model_args,
        2,
        EngineConfig(max_running=8, max_queue=16),
        ServerConfig(served_model_name=MODEL_NAME, request_timeout=request_timeout),
    )


def client(http, **kw):
    return openai.OpenAI(
        base_url=http.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw
    )


def wait_for(predicate, timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def engine_core(http):
    return http.server_state.frontend.instances[0].core


def _draft_pool(core):
    """The speculative draft model's KV pool of an engine (None without a draft model)."""
    return core.spec.draft_cache if core.spec is not None else None


def wait_idle(http, timeout: float = 20.0) -> None:
    """Until the engine holds no sequence and every KV block is free again (the draft
    model's too, when it decodes speculatively with one)."""
    core = engine_core(http)
    sched = core.scheduler
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        idle = not sched.busy
        draft = _draft_pool(core)
        draft_free = draft is None or (draft.num_free_blocks, draft.lens) == (draft.num_blocks, {})
        target_free = core.cache.num_free_blocks == sched.num_blocks and sched.booked == 0
        if idle and target_free and draft_free:
            core.cache.pool.check()  # refcounts, free / cached states and the prefix index
            return
        time.sleep(0.05)
    draft = _draft_pool(core)
    raise AssertionError(
        f"engine not idle: running={len(sched.running)} prefilling={len(sched.prefilling)} "
        f"waiting={len(sched.waiting)} free={core.cache.num_free_blocks}/{sched.num_blocks}"
        + ("" if draft is None else f" draft free={draft.num_free_blocks}/{draft.num_blocks}")
    )


@pytest.fixture(scope="session")
def server(llm):
    """The shared server: small prefill budget so prompts > 64 tokens are chunked."""
    with serve(llm, engine={"max_running": 32, "max_queue": 64, "max_prefill_tokens": 64}) as h:
        yield h


@pytest.fixture(scope="session")
def offline(llm):
    """Greedy reference generations with ``LLMModel.generate`` (same weights, same thread
    count as the engine), cached by (prompt, max_tokens)."""
    cache: dict = {}
    lock = threading.Lock()

    def run(prompt, max_tokens: int):
        key = (repr(prompt), max_tokens)
        with lock:
            if key not in cache:
                out: dict = {}

                def work():
                    torch.set_num_threads(THREADS)
                    cfg = llm.sampling_defaults(max_new_tokens=max_tokens, do_sample=False)
                    out["r"] = llm.generate(prompt, cfg).sequences[0]

                t = threading.Thread(target=work)
                t.start()
                t.join()
                cache[key] = out["r"]
        return cache[key]

    return run
