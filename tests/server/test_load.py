"""Bounded load: many concurrent streams, disconnects, overload, timeouts and a soak of all of
them with embeddings and malformed bodies."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import os
import time

import httpx
import openai
import pytest
import torch

from pace_core.caches.disk_tier import DiskBlockStore, DiskTier
from pace_core.engine.events import Embedding, Token

from .conftest import MODEL_NAME, client, engine_core, serve, wait_idle

PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "List three colors:",
    "A long time ago, in a galaxy far, far away, there was a small planet where",
]


def test_32_concurrent_streams(server):
    """32 streaming clients, mixed prompt/output lengths and sampling; all finish correctly,
    identical greedy requests agree, and the KV pool is empty afterwards."""

    async def one(c: openai.AsyncOpenAI, i: int):
        prompt = PROMPTS[i % len(PROMPTS)] * (1 + i % 3)
        max_tokens = 4 + (i % 4) * 4
        greedy = i % 2 == 0
        stream = await c.completions.create(
            model=MODEL_NAME,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0 if greedy else 0.8,
            seed=i,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, finish, usage = "", None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for ch in chunk.choices:
                text += ch.text
                finish = ch.finish_reason or finish
        return (prompt, max_tokens, greedy), text, finish, usage

    async def main():
        c = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120
        )
        try:
            return await asyncio.wait_for(asyncio.gather(*(one(c, i) for i in range(32))), 150)
        finally:
            await c.close()

    started = time.monotonic()
    results = asyncio.run(main())
    assert time.monotonic() - started < 150
    greedy_text: dict = {}
    for (prompt, max_tokens, greedy), text, finish, usage in results:
        assert finish in ("stop", "length")
        assert usage is not None and 1 <= usage.completion_tokens <= max_tokens
        if finish == "length":
            assert usage.completion_tokens == max_tokens
        if greedy:
            key = (prompt, max_tokens)
            assert greedy_text.setdefault(key, text) == text
    wait_idle(server)


def test_stream_disconnect_frees_kv(server):
    core = engine_core(server)
    body = {
        "model": MODEL_NAME,
        "prompt": PROMPTS[3],
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", server.url + "/v1/completions", json=body) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: "):
                got += 1
                if got == 3:
                    break
        assert core.scheduler.booked > 0  # the sequence is running and holds its booking
    # the connection is closed here, mid-stream: the engine must drop the sequence
    wait_idle(server, timeout=15)


def test_nonstream_disconnect_frees_kv(server):
    body = {"model": MODEL_NAME, "prompt": PROMPTS[0], "max_tokens": 400, "ignore_eos": True}
    with contextlib.suppress(httpx.TimeoutException):
        httpx.post(server.url + "/v1/completions", json=body, timeout=1.5)
    wait_idle(server, timeout=15)


def test_overload_gets_429_not_a_hang(llm):
    with serve(llm, engine={"max_running": 1, "max_queue": 1}) as http:
        c = client(http, timeout=60)

        def call(i):
            try:
                c.completions.create(
                    model=MODEL_NAME, prompt=PROMPTS[i % 4], max_tokens=12, temperature=0
                )
                return 200, None
            except openai.RateLimitError as exc:
                return 429, exc.response.headers.get("retry-after")

        started = time.monotonic()
        with cf.ThreadPoolExecutor(6) as pool:
            results = list(pool.map(call, range(6)))
        assert time.monotonic() - started < 60
        codes = [code for code, _ in results]
        assert codes.count(429) >= 1 and codes.count(200) >= 2, codes
        assert all(ra is not None and int(ra) >= 1 for code, ra in results if code == 429)
        wait_idle(http)
        metrics = httpx.get(http.url + "/metrics").text
        assert 'pace_request_errors_total{instance="frontend",type="rate_limit_error"}' in metrics


def test_request_timeout(llm):
    with serve(llm, request_timeout=1.0) as http:
        body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 500, "ignore_eos": True}
        r = httpx.post(http.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 408 and r.json()["error"]["code"] == "request_timeout"
        r = httpx.post(http.url + "/v1/completions", json={**body, "stream": True}, timeout=30)
        assert r.status_code == 200
        assert '"request_timeout"' in r.text and r.text.rstrip().endswith("data: [DONE]")
        wait_idle(http)


def test_idle_engine_does_not_spin(server):
    wait_idle(server)
    core = engine_core(server)
    thread = server.server_state.frontend.instances[0]._thread
    from pace_bench.one_user import thread_cpu_seconds

    def cpu() -> float:
        return thread_cpu_seconds(os.getpid(), thread.native_id)

    steps, before = core.steps, cpu()
    time.sleep(1.0)
    assert core.steps == steps
    assert cpu() - before <= 0.02  # blocked on its inbox


_BAD_BODIES = [
    b"{",  # not JSON
    b"[]",  # not an object
    b'{"model": "%s"}' % MODEL_NAME.encode(),  # no prompt
    b'{"prompt": 5, "max_tokens": 4}',
    b'{"prompt": "hi", "max_tokens": -1}',
    b'{"prompt": "hi", "temperature": "hot"}',
    b'{"prompt": "hi", "n": 0}',
    b'{"prompt": "hi", "no_such_field": 1}',
    b'{"prompt": "hi", "max_tokens": 0}',  # nothing to answer without echo
    b'{"prompt": "hi", "echo": true, "logprobs": 99}',  # more alternatives than served
]


_BAD_EMBEDDINGS = [
    b"{",
    b'{"input": ""}',
    b'{"input": [[]]}',
    b'{"input": [1, 10000000]}',  # outside the vocabulary
    b'{"input": "hi", "dimensions": 64}',  # not a matryoshka model
    b'{"input": "hi", "encoding_format": "int8"}',
    b'{"input": "hi", "pooling": "mean"}',
    b'{"model": "nope", "input": "hi"}',
    b'{"input": "%s"}' % (b"word " * 3000),  # more tokens than the KV pool holds
]
SCORED = {"echo": True, "logprobs": 1, "temperature": 0}  # a prompt scored, as lm-eval asks
LONG_PROMPT = "In the archive, every ledger of the old harbour office was numbered. " * 8
# The last input is prefilled in chunks (the server's prefill budget is 64 tokens).
EMBED_INPUTS = [PROMPTS[0], PROMPTS[2], PROMPTS[3] * 4]
EMBED_ABANDONED = 12  # inputs of an embedding request the client gives up on


def test_a_soak_of_streams_disconnects_and_bad_bodies_loses_nothing(server, tmp_path):
    """Complete streams (greedy and sampled), streams dropped mid-way, non-stream requests
    given up on (generations and large embeddings), embeddings, scored prompts (echo with
    logprobs, max_tokens 0 and 1, streamed or not), and malformed bodies for
    both routes, three waves at once, with the prefix cache spilling to a disk tier: every
    good request answers 200, every bad one a 4xx, none a 5xx; the KV pool ends empty;
    abandoned requests stop; and the same greedy requests and embeddings give the same
    answers (and prompt scores) after the soak as before it, the long prompt's blocks
    restored from disk."""
    url = server.url + "/v1/completions"
    embed_url = server.url + "/v1/embeddings"
    greedy = [
        {"model": MODEL_NAME, "prompt": p, "max_tokens": 12, "temperature": 0}
        for p in [*PROMPTS, LONG_PROMPT]
    ]
    cache = engine_core(server).cache  # the engine is idle: attaching is safe
    disk = DiskBlockStore(tmp_path, DiskTier.identity(cache), 64 << 20)
    DiskTier.attach(cache, disk)

    def answers() -> tuple[list[str], torch.Tensor, list[float]]:
        texts = [httpx.post(url, json=b, timeout=60).json()["choices"][0]["text"] for b in greedy]
        r = httpx.post(embed_url, json={"model": MODEL_NAME, "input": EMBED_INPUTS}, timeout=60)
        scored = httpx.post(url, json={**greedy[-1], **SCORED}, timeout=60).json()
        vectors = torch.tensor([d["embedding"] for d in r.json()["data"]])
        return texts, vectors, scored["choices"][0]["logprobs"]["token_logprobs"][1:]

    before = answers()
    good, bad = [], []

    async def full_stream(c: httpx.AsyncClient, i: int) -> None:
        body = {"model": MODEL_NAME, "prompt": PROMPTS[i % 4], "max_tokens": 8 + i % 8,
                "temperature": 0 if i % 2 else 0.9, "seed": i, "stream": True}  # fmt: skip
        async with c.stream("POST", url, json=body) as r:
            good.append(r.status_code)
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]" and '"error"' not in "".join(lines)

    async def dropped_stream(c: httpx.AsyncClient, i: int) -> None:
        body = {"model": MODEL_NAME, "prompt": PROMPTS[i % 4] * 3, "max_tokens": 300,
                "ignore_eos": True, "stream": True}  # fmt: skip
        async with c.stream("POST", url, json=body) as r:
            good.append(r.status_code)
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data: ")
                if seen == 2 + i % 3:
                    break  # leaving the block closes the connection mid-stream

    async def given_up(c: httpx.AsyncClient, i: int) -> None:
        body = {"model": MODEL_NAME, "prompt": PROMPTS[i % 4], "max_tokens": 300,
                "ignore_eos": True}  # fmt: skip
        with contextlib.suppress(httpx.TimeoutException):
            good.append((await c.post(url, json=body, timeout=0.3)).status_code)

    async def embedded(c: httpx.AsyncClient, i: int) -> None:
        inputs = EMBED_INPUTS[: 1 + i % 3]
        r = await c.post(embed_url, json={"model": MODEL_NAME, "input": inputs})
        good.append(r.status_code)
        assert len(r.json()["data"]) == len(inputs)

    async def embedding_given_up(c: httpx.AsyncClient, i: int) -> None:
        inputs = [f"{i}.{k} " + PROMPTS[3] * 4 for k in range(EMBED_ABANDONED)]  # ~1,000 tokens
        with contextlib.suppress(httpx.TimeoutException):
            r = await c.post(embed_url, json={"model": MODEL_NAME, "input": inputs}, timeout=0.3)
            good.append(r.status_code)

    async def scored(c: httpx.AsyncClient, i: int) -> None:
        body = {"model": MODEL_NAME, "prompt": PROMPTS[i % 4], **SCORED, "max_tokens": i % 2,
                "stream": i % 3 == 0}  # fmt: skip
        r = await c.post(url, json=body)
        good.append(r.status_code)
        if body["stream"]:
            assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text
            return
        lp, usage = r.json()["choices"][0]["logprobs"], r.json()["usage"]
        assert len(lp["tokens"]) == usage["prompt_tokens"] + i % 2 and lp["tokens"]
        assert lp["token_logprobs"][0] is None and None not in lp["token_logprobs"][1:]

    async def malformed(c: httpx.AsyncClient, route: str, content: bytes) -> None:
        r = await c.post(route, content=content, headers={"content-type": "application/json"})
        bad.append((r.status_code, content[:60]))

    async def soak() -> None:
        async with httpx.AsyncClient(timeout=120) as c:
            for wave in range(3):
                jobs = [full_stream(c, 8 * wave + i) for i in range(8)]
                jobs += [dropped_stream(c, 6 * wave + i) for i in range(6)]
                jobs += [given_up(c, 3 * wave + i) for i in range(3)]
                jobs += [embedded(c, 3 * wave + i) for i in range(3)]
                jobs += [embedding_given_up(c, 2 * wave + i) for i in range(2)]
                jobs += [scored(c, 3 * wave + i) for i in range(3)]
                jobs += [malformed(c, url, body) for body in _BAD_BODIES]
                jobs += [malformed(c, embed_url, body) for body in _BAD_EMBEDDINGS]
                await asyncio.gather(*jobs)

    core = engine_core(server)
    emit, generated, embedded_n = core.emit, [], []

    def counting(events: list) -> None:  # what the engine makes, for cancelled requests too
        generated.append(sum(isinstance(e, Token) for e in events))
        embedded_n.append(sum(isinstance(e, Embedding) for e in events))
        emit(events)

    core.emit = counting
    try:
        asyncio.run(asyncio.wait_for(soak(), 240))
        wait_idle(server, timeout=60)
        cache.pool.clear_cached()  # what stays cached in memory now comes back from disk
        hits = cache.disk_hits
        after = answers()
    finally:
        core.emit = emit
        DiskTier.detach(cache)
    assert good and all(code == 200 for code in good), good
    assert all(400 <= code < 500 for code, _ in bad), bad
    assert len(bad) == 3 * (len(_BAD_BODIES) + len(_BAD_EMBEDDINGS))
    complete = sum(8 + i % 8 for i in range(24))  # what the complete streams asked for
    complete += 3 * 3  # a scored request draws one token (max_tokens 0: one not answered)
    abandoned = 3 * (6 + 3) * 300  # ... and the dropped and given-up requests
    assert sum(generated) < complete + abandoned / 2, "abandoned requests kept generating"
    complete = sum(1 + i % 3 for i in range(9))  # the embeddings answered, then abandoned ones
    abandoned = 3 * 2 * EMBED_ABANDONED
    assert sum(embedded_n) < complete + abandoned / 2, "abandoned embeddings kept running"
    texts, vectors, scores = after
    assert texts == before[0]
    torch.testing.assert_close(vectors, before[1], atol=1e-5, rtol=0)
    assert scores == pytest.approx(before[2], abs=1e-5)
    disk.flush()
    assert disk.written > 0 and cache.disk_hits - hits >= 64  # the long prompt's block
