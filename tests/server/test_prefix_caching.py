"""Automatic prefix caching in the server: identical greedy outputs with and without it,
cached-token accounting in usage and metrics, tenant isolation by cache_salt, and
speculative decoding on top of shared blocks."""

from __future__ import annotations

import concurrent.futures as cf

import httpx
import pytest
import torch

from pace_core.engine.llm import LLMModel
from pace_core.sampling import SamplingConfig

from .conftest import MODEL_NAME, client, serve, wait_idle

SYSTEM = (
    "You are the support assistant of a small bakery. The bakery opens at seven in the morning "
    "and closes at six in the evening, except on Sundays, when it closes at noon. It sells "
    "sourdough bread, rye bread, croissants, cinnamon rolls, apple pie and lemon cake. Orders "
    "for cakes must be placed two days in advance. Delivery is free within five kilometres "
    "and costs three euros beyond that. Customers with allergies should ask about nuts, "
    "because every product is made in a kitchen that also handles almonds and hazelnuts. "
) * 3
QUESTIONS = ["When do you open?", "Do you deliver?", "Is there cake?", "Any nuts?"]
BLOCK = 64  # the paged block of the test server's cache


def _ask(http, question: str, **kw):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return client(http).chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=12, temperature=0, **kw
    )


def _answers(http) -> tuple[list[str], list[int]]:
    """The questions asked one by one, then all at once; texts and cached tokens."""
    one = [_ask(http, q) for q in QUESTIONS]
    with cf.ThreadPoolExecutor(len(QUESTIONS)) as pool:
        many = list(pool.map(lambda q: _ask(http, q), QUESTIONS))
    outs = one + many
    return [o.choices[0].message.content for o in outs], [
        o.usage.prompt_tokens_details.cached_tokens for o in outs
    ]


def test_greedy_outputs_are_identical_with_and_without_caching(llm):
    with serve(llm, engine={"prefix_caching": False}) as off:
        expected, cached_off = _answers(off)
    with serve(llm) as on:
        texts, cached = _answers(on)
        wait_idle(on)
        prompt = _ask(on, QUESTIONS[0]).usage.prompt_tokens
    assert texts == expected
    assert cached_off == [0] * len(cached_off)
    assert cached[0] == 0 and 4 * BLOCK <= cached[1] < prompt and cached[1] % BLOCK == 0
    assert all(c == cached[1] for c in cached[1:]), cached


def test_metrics_salt_and_streamed_usage(llm):
    with serve(llm) as http:
        _ask(http, QUESTIONS[0], extra_body={"cache_salt": "tenant-a"})
        other = _ask(http, QUESTIONS[0], extra_body={"cache_salt": "tenant-b"})
        same = _ask(http, QUESTIONS[1], extra_body={"cache_salt": "tenant-a"})
        assert other.usage.prompt_tokens_details.cached_tokens == 0
        assert same.usage.prompt_tokens_details.cached_tokens >= 4 * BLOCK
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]
        stream = client(http).chat.completions.create(
            model=MODEL_NAME,
            messages=messages,
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"cache_salt": "tenant-a"},
        )
        usage = [c.usage for c in stream if c.usage is not None][-1]
        assert usage.prompt_tokens_details.cached_tokens >= 4 * BLOCK
        text = httpx.get(http.url + "/metrics").text
        values = {
            line.split("{")[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("pace_prefix_cache_")
        }
        assert values["pace_prefix_cache_hits_total"] >= 8 * BLOCK
        assert values["pace_prefix_cache_queries_total"] > values["pace_prefix_cache_hits_total"]
        wait_idle(http)


def test_salt_is_validated(server):
    r = httpx.post(
        server.url + "/v1/completions",
        json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 1, "cache_salt": ""},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


@pytest.fixture(scope="module")
def spec_llm(smollm2_dir):
    return LLMModel(
        smollm2_dir,
        dtype=torch.float32,
        kv_cache_type="paged",
        max_cache_tokens=2048,
        spec_config={"method": "prompt_lookup", "num_speculative_tokens": 4},
        quiet=True,
    )


def test_speculative_decoding_over_shared_blocks(spec_llm, llm):
    """Prompt lookup drafts and rolls back on top of adopted blocks: the greedy text equals
    plain offline decoding of the same chat."""
    messages = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
                for q in QUESTIONS]  # fmt: skip
    cfg = SamplingConfig(max_new_tokens=24)
    expected = llm.generate(messages, cfg).texts
    with serve(spec_llm) as http:
        outs = [
            client(http).chat.completions.create(
                model=MODEL_NAME, messages=m, max_tokens=24, temperature=0
            )
            for m in messages
        ]
        wait_idle(http)
    assert [o.choices[0].message.content for o in outs] == expected
    assert outs[-1].usage.prompt_tokens_details.cached_tokens >= 4 * BLOCK
