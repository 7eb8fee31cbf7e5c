"""Speculative decoding in `pace serve`: exactness under continuous batching, limits, stops,
streaming, cancellation, metrics, usage, KV pools and the --spec-config start-up errors.

Uses the tiny random target / draft pairs of ``tests/speculative`` (fp32, word-level tokenizer:
``w<id>`` per token, so texts compare token for token).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json

import httpx
import openai
import pytest
import torch
from support.spec_models import prompts

from pace_core.cli import main as serve_main
from pace_core.engine.config import EngineConfig
from pace_core.engine.core import EngineCore
from pace_core.engine.events import Event, SeqSpec, Token
from pace_core.engine.llm import LLMModel
from pace_core.sampling.config import SamplingConfig
from pace_core.server.launch.cli import spec_config_arg
from pace_core.speculative.config import coerce_spec_config

from .conftest import MODEL_NAME, client, engine_core, serve, wait_idle
from .test_engine import one_thread

CACHE_TOKENS = 2048
# 4 running at most (the other requests wait and join mid-flight); 8-token prefill chunks
ENGINE = {"max_running": 4, "max_prefill_tokens": 8}
SPECS = {
    "prompt_lookup": lambda d: {
        "method": "prompt_lookup",
        "num_speculative_tokens": 5,
        "max_ngram": 2,
    },
    "draft": lambda d: {
        "method": "draft",
        "model_name_or_path": str(d["draft"]),
        "num_speculative_tokens": 3,
    },
    "self_draft": lambda d: {  # the target as its own draft: every draft is accepted
        "method": "draft",
        "model_name_or_path": str(d["target"]),
        "num_speculative_tokens": 4,
    },
    "pard": lambda d: {  # wider draft vocabulary (mask token), drafts rarely accepted
        "method": "pard",
        "model_name_or_path": str(d["pard"]),
        "num_speculative_tokens": 4,
    },
    "self_pard": lambda d: {  # first draft right, mask drafts often wrong: mixed lengths
        "method": "pard",
        "model_name_or_path": str(d["self_pard"]),
        "num_speculative_tokens": 3,
    },
}
# (prompt, max_tokens): different prompt lengths (one chunked over 4 prefill iterations) and
# budgets, so sequences join and leave the running batch at different iterations
REQUESTS = list(zip((p.tolist() for p in prompts((5, 9, 3, 12, 7, 30))), (20, 7, 13, 24, 1, 18)))
REPETITIVE = [1, 2, 3, 4, 5] * 6


@pytest.fixture(scope="module")
def dirs(target_dir, draft_dir, pard_dir, self_pard_dir):
    return {"target": target_dir, "draft": draft_dir, "pard": pard_dir, "self_pard": self_pard_dir}


@pytest.fixture(scope="module")
def plain(target_dir, word_tokenizer):
    return LLMModel(target_dir, tokenizer=word_tokenizer, dtype=torch.float32, quiet=True)


@pytest.fixture(scope="module")
def offline(plain):
    """Offline non-speculative ``LLMModel.generate``, one prompt at a time, cached."""
    done: dict = {}

    def run(prompt: list[int], max_tokens: int, stop: list[str] | None = None):
        key = (tuple(prompt), max_tokens, tuple(stop or ()))
        if key not in done:
            cfg = SamplingConfig(max_new_tokens=max_tokens, ignore_eos=True, stop=stop)
            done[key] = plain.generate([torch.tensor(prompt)], cfg).sequences[0]
        return done[key]

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield run
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def load(dirs, word_tokenizer):
    """``load(method, cache, cache_tokens)``: the tiny target, speculative with ``method``
    (None: plain)."""

    def make(method: str | None, cache: str = "paged", tokens: int = CACHE_TOKENS) -> LLMModel:
        return LLMModel(
            dirs["target"],
            tokenizer=word_tokenizer,
            dtype=torch.float32,
            kv_cache_type=cache,
            max_cache_tokens=tokens,
            spec_config=None if method is None else SPECS[method](dirs),
            quiet=True,
        )

    return make


@pytest.fixture(scope="module")
def servers(load):
    """``servers(method, cache, cache_tokens)``: an in-process server of ``load(...)``,
    started once per module."""
    made: dict = {}
    with contextlib.ExitStack() as stack:

        def get(method: str | None, cache: str = "paged", tokens: int = CACHE_TOKENS):
            key = (method, cache, tokens)
            if key not in made:
                made[key] = stack.enter_context(serve(load(method, cache, tokens), engine=ENGINE))
            return made[key]

        yield get


def complete(http, prompt, max_tokens, **kw):
    extra = {"ignore_eos": True, **kw.pop("extra_body", {})}
    return client(http).completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=max_tokens, extra_body=extra, **kw
    )


def concurrently(fn, items):
    with concurrent.futures.ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(fn, items))


def spec_usage(out) -> dict:
    return out.usage.model_extra["spec_decode"]


def test_plain_serving_matches_offline(servers, offline):
    http = servers(None)
    outs = concurrently(lambda r: complete(http, r[0], r[1], temperature=0), REQUESTS)
    for (prompt, mt), out in zip(REQUESTS, outs):
        assert out.choices[0].text == offline(prompt, mt).text
        assert "spec_decode" not in (out.usage.model_extra or {})


@pytest.mark.parametrize("cache", ["paged", "slab_pool"])
@pytest.mark.parametrize("method", list(SPECS))
def test_greedy_equals_offline_under_concurrency(method, cache, servers, offline):
    """6 greedy requests (prompts 3-30 tokens, max_tokens 1-24) and 2 seeded sampled ones at
    once, 4 running at a time: every greedy text is the offline non-speculative one; sampled
    requests get exactly max_tokens; nothing stays in either KV pool."""
    http = servers(method, cache)
    sampled = [(REPETITIVE, 16, 7), (REQUESTS[3][0], 11, 8)]

    def one(item):
        if len(item) == 3:
            prompt, mt, seed = item
            return complete(http, prompt, mt, temperature=0.8, seed=seed)
        return complete(http, item[0], item[1], temperature=0)

    outs = concurrently(one, REQUESTS + sampled)
    for (prompt, mt), out in zip(REQUESTS, outs):
        assert out.choices[0].text == offline(prompt, mt).text, (method, cache, len(prompt))
        assert out.usage.completion_tokens == mt and out.choices[0].finish_reason == "length"
    for (_, mt, _), out in zip(sampled, outs[len(REQUESTS) :]):
        assert out.usage.completion_tokens == mt and len(out.choices[0].text.split()) == mt
    stats = [spec_usage(o) for o in outs]
    assert all(s["num_accepted_tokens"] <= s["num_draft_tokens"] for s in stats)
    # every token but the prefill's first comes from a verification step
    for s, o in zip(stats, outs):
        assert s["num_emitted_tokens"] == o.usage.completion_tokens - 1
    if method == "self_draft":
        assert all(s["acceptance_rate"] == 1.0 for s in stats[: len(REQUESTS)] if s["num_drafts"])
    wait_idle(http)
    core = engine_core(http)
    if method != "prompt_lookup":
        assert core.spec.draft_cache.block_size == core.cache.block_size


def test_sampled_requests_are_reproducible(servers):
    http = servers("self_pard")
    a, b = (complete(http, REPETITIVE, 20, temperature=1.0, seed=3) for _ in range(2))
    assert a.choices[0].text == b.choices[0].text
    c = complete(http, REPETITIVE, 20, temperature=1.0, seed=4)
    assert c.usage.completion_tokens == 20 and spec_usage(c)["num_steps"] > 0


def test_streaming_returns_the_same_text(servers, offline):
    http = servers("self_draft")

    def stream(item):
        prompt, mt = item
        events = client(http).completions.create(
            model=MODEL_NAME,
            prompt=prompt,
            max_tokens=mt,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(events)
        return [c.choices[0].text for c in chunks if c.choices], chunks[-1].usage

    outs = concurrently(stream, REQUESTS[:4])
    for (prompt, mt), (texts, usage) in zip(REQUESTS[:4], outs):
        assert "".join(texts) == offline(prompt, mt).text
        assert len(texts) == mt  # one chunk per token, even when a step accepts several
        stats = usage.model_extra["spec_decode"]
        assert usage.completion_tokens == mt and stats["num_emitted_tokens"] == mt - 1
        assert mt < 3 or stats["num_accepted_tokens"] > 0


def test_logprobs_match_plain_serving(servers):
    prompt, mt = REQUESTS[3]
    want = complete(servers(None), prompt, mt, temperature=0, logprobs=2).choices[0].logprobs
    got = complete(servers("self_draft"), prompt, mt, temperature=0, logprobs=2)
    lp = got.choices[0].logprobs
    assert spec_usage(got)["num_accepted_tokens"] > 0
    assert lp.tokens == want.tokens and lp.text_offset == want.text_offset
    assert lp.token_logprobs == pytest.approx(want.token_logprobs, abs=1e-4)
    for a, b in zip(lp.top_logprobs, want.top_logprobs):
        assert a.keys() == b.keys()
        assert list(a.values()) == pytest.approx(list(b.values()), abs=1e-4)


@pytest.mark.parametrize("method", ["self_draft", "self_pard", "prompt_lookup"])
def test_max_tokens_never_overshot_in_a_tight_pool(method, servers, offline, monkeypatch):
    """The pool holds exactly one 10-token prompt + 22 tokens (two 16-token blocks): a
    verification step that went past prompt + max_tokens would run out of KV; every budget is
    hit exactly."""
    monkeypatch.setenv("PACE_PAGED_BLOCK_TOKENS", "16")  # read when the engine's pool is made
    http = servers(method, "paged", 32)
    prompt = REPETITIVE[:10]
    for mt in (1, 2, 3, 5, 8, 22):
        out = complete(http, prompt, mt, temperature=0)
        assert out.usage.completion_tokens == mt and out.choices[0].finish_reason == "length"
        assert out.choices[0].text == offline(prompt, mt).text
    with pytest.raises(openai.BadRequestError, match="needs more KV cache"):
        complete(http, prompt, 23, temperature=0)
    wait_idle(http)


def test_stop_string_inside_an_accepted_run(servers, offline):
    http = servers("self_draft")
    prompt = REQUESTS[0][0]
    words = offline(prompt, 20).text.split()
    i, stop = next((i, w) for i, w in enumerate(words) if i >= 6 and w not in words[:i])
    want = offline(prompt, 20, [f" {stop}"])
    out = complete(http, prompt, 20, temperature=0, stop=[f" {stop}"])
    assert out.choices[0].text == want.text and stop not in out.choices[0].text
    assert out.choices[0].finish_reason == want.finish_reason == "stop"
    assert out.usage.completion_tokens == len(want.token_ids) == i + 1
    stats = spec_usage(out)  # the stop cut a run: fewer tokens than accepted + 1 per step
    assert stats["num_emitted_tokens"] < stats["num_accepted_tokens"] + stats["num_steps"]
    wait_idle(http)


def test_cancel_mid_flight_frees_target_and_draft_kv(load, offline):
    """Engine driven one iteration at a time: a running sequence is cancelled while others
    continue (and one joins later); the cancelled one's target and draft KV go at once."""
    llm = load("draft")
    events: list[Event] = []
    core = EngineCore(llm.handle, EngineConfig(**ENGINE), events.extend)
    draft = core.spec.draft_cache

    def spec(key, i):
        prompt, _ = REQUESTS[i]
        return SeqSpec(key, prompt, SamplingConfig(max_new_tokens=24, ignore_eos=True))

    def tokens(key):
        return [e.token for e in events if isinstance(e, Token) and e.key == key]

    with one_thread():
        core.submit([spec("a", 0), spec("b", 1), spec("c", 2)])
        for _ in range(4):
            core.run_once()
        assert len(core.scheduler.running) == 3 and len(draft.lens) == 3 and tokens("b")
        core.cancel(["b"])
        core.submit([spec("d", 3)])
        core.run_once()
        assert "b" not in [s.spec.key for s in core.scheduler.running]
        # a, c run; d (12 tokens) is still prefilling: target KV yet, no draft KV
        assert len(core.cache.lens) == 3 and len(draft.lens) == 2
        while core.busy:
            core.run_once()
    for key, i in (("a", 0), ("c", 2), ("d", 3)):
        assert tokens(key) == offline(REQUESTS[i][0], 24).token_ids
    assert len(tokens("b")) < 24
    assert core.cache.num_free_blocks == core.scheduler.num_blocks and not core.cache.lens
    assert draft.num_free_blocks == draft.num_blocks and not draft.lens
    assert core.scheduler.booked == 0


def test_client_disconnect_frees_kv(servers, offline):
    http = servers("draft")
    body = {"prompt": REQUESTS[0][0], "max_tokens": 200, "temperature": 0, "stream": True}
    with (
        httpx.Client(base_url=http.url, timeout=30) as c,
        c.stream("POST", "/v1/completions", json={**body, "ignore_eos": True}) as r,
    ):
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # leave after the first token: the connection closes
    wait_idle(http)
    prompt, mt = REQUESTS[1]
    assert complete(http, prompt, mt, temperature=0).choices[0].text == offline(prompt, mt).text


def _metric(text: str, series: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(series + "{") or line.startswith(series + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_and_usage_are_consistent(servers, dirs):
    http = servers("prompt_lookup")
    before = httpx.get(http.url + "/metrics").text
    out = complete(http, REPETITIVE, 40, temperature=0)
    after = httpx.get(http.url + "/metrics").text

    def delta(series):
        return _metric(after, series) - _metric(before, series)

    usage = spec_usage(out)
    spec = SPECS["prompt_lookup"](dirs)
    offline_spec = LLMModel(
        dirs["target"], dtype=torch.float32, spec_config=spec, load_tokenizer=False
    )
    ref = offline_spec.generate([torch.tensor(REPETITIVE)], SamplingConfig(max_new_tokens=40))
    assert usage["num_draft_tokens"] == ref.spec_stats.num_draft_tokens > 0
    assert usage["num_accepted_tokens"] == ref.spec_stats.num_accepted_tokens > 0
    proposed = delta("pace_spec_decode_draft_tokens_total")
    accepted = delta("pace_spec_decode_accepted_tokens_total")
    assert (proposed, accepted) == (usage["num_draft_tokens"], usage["num_accepted_tokens"])
    assert 0 < accepted <= proposed
    assert delta("pace_spec_decode_draft_tokens_per_position_total") == proposed
    assert delta("pace_spec_decode_accepted_tokens_per_position_total") == accepted
    for j, (p, a) in enumerate(zip(usage["proposed_per_position"], usage["accepted_per_position"])):
        pos = f'{{instance="0",position="{j}"}}'
        assert _metric(after, "pace_spec_decode_draft_tokens_per_position_total" + pos) >= p
        assert a <= p
    assert delta("pace_spec_decode_accepted_length_count") == usage["num_drafts"]
    assert delta("pace_spec_decode_accepted_length_sum") == accepted
    assert usage["mean_accepted_length"] == pytest.approx(accepted / usage["num_drafts"])


def test_spec_series_exist_before_traffic(servers):
    text = httpx.get(servers("self_pard", "slab_pool").url + "/metrics").text
    for series in (
        'pace_spec_decode_draft_tokens_total{instance="0"}',
        'pace_spec_decode_accepted_tokens_total{instance="0"}',
        'pace_spec_decode_accepted_length_count{instance="0"}',
    ):
        assert series in text
    plain = httpx.get(servers(None).url + "/metrics").text
    assert 'pace_spec_decode_draft_tokens_total{instance="0"}' not in plain


@pytest.mark.parametrize(
    "value, message",
    [
        ('{"method": "prompt_lookup", "num_speculative_tokens": 0}', "num_speculative_tokens"),
        ('{"method": "medusa"}', "'method' in"),
        ('{"method": "draft", "model": "x"}', "valid: ['model_name_or_path'"),
        ('{"method": "pard", "model_name_or_path": "d", "pard_token": -1}', "pard_token"),
        ('{"method": "pard"', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ("no/such/spec.json", "neither a JSON object nor a JSON file"),
    ],
)
def test_bad_spec_config_is_a_clean_startup_error(value, message, capsys):
    with pytest.raises(SystemExit) as exc:
        serve_main(["serve", "--spec-config", value])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "argument --spec-config" in err and message in err and "Traceback" not in err


def test_missing_draft_model_is_a_clean_error(tmp_path, capsys):
    spec = json.dumps({"method": "draft", "model_name_or_path": str(tmp_path / "nope")})
    assert serve_main(["serve", "--spec-config", spec]) == 2
    err = capsys.readouterr().err
    assert "--spec-config model_name_or_path" in err and "Traceback" not in err


def test_spec_config_from_a_file(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"method": "ngram", "num_speculative_tokens": 3}))
    parsed = spec_config_arg(str(path))
    assert coerce_spec_config(parsed).num_speculative_tokens == 3


def test_structured_outputs_are_a_400_with_speculation(servers):
    http = servers("prompt_lookup")
    body = {"model": MODEL_NAME, "prompt": [1, 2, 3], "max_tokens": 4}
    r = httpx.post(
        http.url + "/v1/completions", json={**body, "response_format": {"type": "json_object"}}
    )
    err = r.json()["error"]
    assert r.status_code == 400 and "speculative" in err["message"], r.text
    assert err["param"] == "response_format"
