"""OpenAI API surface against the real SmolLM2, driven by the official openai client."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import httpx
import pytest

from .conftest import MODEL_NAME, client, wait_for, wait_idle

PROMPTS = [
    "Once upon a time, there was a little",
    "The capital of France is",
    "def fibonacci(n):",
]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def _complete(http, prompt, max_tokens, **kw):
    return client(http).completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0, **kw
    )


def test_completions_greedy_match_offline_under_batching(server, offline):
    refs = [offline(p, 16) for p in PROMPTS]
    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:  # concurrent: one batch in the engine
        outs = list(pool.map(lambda p: _complete(server, p, 16), PROMPTS))
    for ref, out in zip(refs, outs):
        choice = out.choices[0]
        assert choice.text == ref.text
        assert out.usage.completion_tokens == len(ref.token_ids)
        assert out.usage.prompt_tokens == len(ref.prompt_token_ids)
        assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
        assert choice.finish_reason == ref.finish_reason
        assert out.object == "text_completion" and out.model == MODEL_NAME and out.id
    wait_idle(server)


def test_token_ids_match_offline(server, offline):
    """logprobs tokens give the token sequence; compare ids via the tokenizer round trip."""
    ref = offline(PROMPTS[0], 12)
    out = _complete(server, ref.prompt_token_ids, 12, logprobs=0)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(ref.token_ids) == out.usage.completion_tokens
    assert "".join(lp.tokens) == ref.text
    assert all(v <= 0 for v in lp.token_logprobs)


def test_long_prompt_chunked_prefill_matches_offline(server, offline, llm):
    # ~300 tokens with a 64-token prefill budget: prefilled in 5 chunks over 5 iterations.
    prompt = " ".join(f"item {i}," for i in range(100)) + " and the next item is"
    assert len(llm.tokenizer(prompt)["input_ids"]) > 4 * 64
    ref = offline(prompt, 8)
    out = _complete(server, prompt, 8)
    assert out.choices[0].text == ref.text


def test_chat_greedy_matches_offline(server, offline):
    ref = offline([CHAT], 20)
    out = client(server).chat.completions.create(
        model=MODEL_NAME, messages=CHAT, max_tokens=20, temperature=0
    )
    assert out.object == "chat.completion"
    msg = out.choices[0].message
    assert msg.role == "assistant" and msg.content == ref.text
    assert out.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert out.usage.completion_tokens == len(ref.token_ids)
    assert out.choices[0].finish_reason == ref.finish_reason


def test_completion_stream_with_usage(server):
    full = _complete(server, PROMPTS[1], 10)
    stream = client(server).completions.create(
        model=MODEL_NAME,
        prompt=PROMPTS[1],
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.total_tokens == full.usage.total_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_stream_n2_with_usage(server):
    stream = client(server).chat.completions.create(
        model=MODEL_NAME,
        messages=CHAT,
        max_tokens=8,
        n=2,
        temperature=0.8,
        seed=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, reasons, roles = {0: "", 1: ""}, {}, set()
    usage = None
    for c in stream:
        if c.usage is not None:
            usage = c.usage
        for ch in c.choices:
            if ch.delta.role:
                roles.add(ch.index)
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                reasons[ch.index] = ch.finish_reason
    assert roles == {0, 1}
    assert set(reasons) == {0, 1}
    assert usage is not None and usage.completion_tokens <= 16
    non_stream = client(server).chat.completions.create(
        model=MODEL_NAME, messages=CHAT, max_tokens=8, n=2, temperature=0.8, seed=7
    )
    assert [c.message.content for c in non_stream.choices] == [texts[0], texts[1]]


def test_n_and_seed_reproducible(server):
    def run():
        return client(server).completions.create(
            model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=8, n=3, temperature=1.0, seed=123
        )

    a, b = run(), run()
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1  # per-choice seeds differ
    assert a.usage.prompt_tokens == b.usage.prompt_tokens
    assert a.usage.completion_tokens <= 24


def test_mixed_sampling_in_one_batch(server, offline, llm):
    """Greedy, random, penalties and seeds together: the greedy rows stay exact."""
    ref = offline(PROMPTS[2], 12)
    (the,) = llm.tokenizer(" the")["input_ids"]
    jobs = [
        dict(prompt=PROMPTS[2], temperature=0),
        dict(prompt=PROMPTS[0], temperature=0.9, seed=1, top_p=0.9),
        dict(prompt=PROMPTS[1], temperature=0.7, frequency_penalty=1.0, presence_penalty=0.5),
        dict(prompt=PROMPTS[0], temperature=1.0, extra_body={"top_k": 5, "min_p": 0.05}),
        dict(prompt=PROMPTS[1], temperature=0, extra_body={"repetition_penalty": 1.3}),
        dict(prompt=PROMPTS[2], temperature=0, logit_bias={str(the): 100}),
    ]
    c = client(server)
    with cf.ThreadPoolExecutor(len(jobs)) as pool:
        futs = [
            pool.submit(c.completions.create, model=MODEL_NAME, max_tokens=12, **j) for j in jobs
        ]
        outs = [f.result() for f in futs]
    assert outs[0].choices[0].text == ref.text
    for out in outs:
        assert out.usage.completion_tokens >= 1
    assert outs[5].choices[0].text == " the" * 12  # +100 bias forces the token
    wait_idle(server)


def test_completion_logprobs(server):
    out = _complete(server, PROMPTS[0], 6, logprobs=3)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for tok, val, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) <= 3 and val <= 0
        assert tok in top  # greedy: the chosen token is the best one
        assert max(top.values()) == pytest.approx(val, abs=1e-5)


def test_chat_logprobs(server):
    out = client(server).chat.completions.create(
        model=MODEL_NAME, messages=CHAT, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2
    )
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert "".join(c.token for c in content) == out.choices[0].message.content
    for item in content:
        assert len(item.top_logprobs) == 2
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
        assert bytes(item.bytes).decode("utf-8", "replace")


def test_logprobs_of_characters_split_over_tokens(server):
    """SmolLM2's byte-level BPE spells 猫 with three tokens: their ``bytes`` are its UTF-8
    (were U+FFFD's each), a part of a character reads ``bytes:\\x..`` (distinct ones no longer
    collide as top_logprobs keys), and text_offset indexes the returned text (it counted
    each part as one character)."""
    c = client(server)
    chat = c.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Write 猫 three times"}],
        max_tokens=8, temperature=0, logprobs=True, top_logprobs=3,
    )  # fmt: skip
    content = chat.choices[0].logprobs.content
    joined = bytes(b for item in content for b in item.bytes)
    assert joined.decode("utf-8") == chat.choices[0].message.content
    out = c.completions.create(model=MODEL_NAME, prompt="猫 is a cat", max_tokens=3,
                               temperature=0, echo=True, logprobs=0)  # fmt: skip
    text, lp = out.choices[0].text, out.choices[0].logprobs
    assert lp.tokens[:3] == ["bytes:\\xe7", "bytes:\\x8c", "bytes:\\xab"]
    assert lp.text_offset[:4] == [0, 0, 0, 1]  # the parts start the character; " is" at 1
    for token, offset in zip(lp.tokens[3:], lp.text_offset[3:]):
        assert text.startswith(token, offset)
    wide = c.completions.create(model=MODEL_NAME, prompt="中文：我喜欢", max_tokens=4,
                                temperature=0, logprobs=5)  # fmt: skip
    assert [len(top) for top in wide.choices[0].logprobs.top_logprobs] == [5] * 4


def test_prompt_forms(server, llm):
    ids = llm.tokenizer(PROMPTS[1])["input_ids"]
    c = client(server)
    a = c.completions.create(model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=4, temperature=0)
    b = c.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=4, temperature=0)
    assert a.choices[0].text == b.choices[0].text
    many = c.completions.create(
        model=MODEL_NAME, prompt=[PROMPTS[1], PROMPTS[0]], max_tokens=4, temperature=0, n=2
    )
    assert [ch.index for ch in many.choices] == [0, 1, 2, 3]
    assert many.choices[0].text == many.choices[1].text == a.choices[0].text
    both = c.completions.create(
        model=MODEL_NAME, prompt=[ids, ids[:3]], max_tokens=4, temperature=0
    )
    assert both.choices[0].text == a.choices[0].text
    assert both.usage.prompt_tokens == len(ids) + 3


def test_stop_strings_and_echo(server):
    c = client(server)
    full = c.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=16, temperature=0)
    text = full.choices[0].text
    word = text.split()[2]
    out = c.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=16, temperature=0, stop=[word, "zzz"]
    )
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].text == text[: text.index(word)]
    echo = c.completions.create(
        model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=3, temperature=0, echo=True
    )
    assert echo.choices[0].text.startswith(PROMPTS[0])


def test_echo_with_logprobs_scores_the_prompt(server, llm):
    """lm-evaluation-harness's loglikelihood request (``local-completions``): the prompt's
    tokens lead ``logprobs``, each scored given the ones before it, then the completion's."""
    import torch

    ids = llm.tokenizer(PROMPTS[1])["input_ids"]
    n = len(ids)
    kw = dict(model=MODEL_NAME, prompt=ids, max_tokens=2, temperature=0, echo=True, logprobs=3)
    out = client(server).completions.create(**kw)
    choice = out.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n + 2
    assert "".join(lp.tokens) == choice.text and choice.text.startswith(PROMPTS[1])
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset[0] == 0
    assert all(lp.text_offset[t + 1] == lp.text_offset[t] + len(lp.tokens[t]) for t in range(n + 1))
    # the reference: every position's logits of one whole-prompt forward (no chunks)
    logits = llm.logits(torch.tensor([ids]))[0].float()
    want = torch.log_softmax(logits, dim=-1)
    for t in range(1, n):
        assert lp.token_logprobs[t] == pytest.approx(float(want[t - 1, ids[t]]), abs=1e-4)
        top = want[t - 1].topk(3)
        got = sorted(lp.top_logprobs[t].values(), reverse=True)
        assert got == pytest.approx(top.values.tolist(), abs=1e-4)
    # the completion's own tokens keep their logprobs after the prompt's
    plain = client(server).completions.create(**{**kw, "echo": False})
    assert lp.token_logprobs[n:] == pytest.approx(plain.choices[0].logprobs.token_logprobs)
    # streamed: the prompt's logprobs ride on the first chunk
    chunks = list(client(server).completions.create(**kw, stream=True))
    streamed = [x for c in chunks if c.choices for x in c.choices[0].logprobs.token_logprobs]
    assert streamed[0] is None
    assert streamed[1:] == pytest.approx(lp.token_logprobs[1:])
    # every choice scores its prompt: each one's first chunk leads with it
    two = list(client(server).completions.create(**kw, n=2, stream=True))
    for index in (0, 1):
        first = next(c.choices[0] for c in two if c.choices and c.choices[0].index == index)
        assert first.logprobs.token_logprobs[1:n] == pytest.approx(lp.token_logprobs[1:n])


def test_echo_with_max_tokens_0_scores_the_prompt_only(server, llm):
    """``max_tokens: 0`` with ``echo`` (OpenAI's legacy scoring request): the prompt and its
    logprobs, no completion token; without ``echo`` it would answer nothing, a 400."""
    ids = llm.tokenizer(PROMPTS[0])["input_ids"]
    kw = dict(model=MODEL_NAME, prompt=ids, temperature=0, echo=True, logprobs=1)
    full = client(server).completions.create(**kw, max_tokens=1)
    out = client(server).completions.create(**kw, max_tokens=0)
    (choice,) = out.choices
    assert choice.text == llm.tokenizer.decode(ids) and choice.finish_reason == "length"
    assert out.usage.completion_tokens == 0 and out.usage.prompt_tokens == len(ids)
    n = len(ids)
    assert choice.logprobs.tokens == full.choices[0].logprobs.tokens[:n]
    assert choice.logprobs.token_logprobs == full.choices[0].logprobs.token_logprobs[:n]
    chunks = list(
        client(server).completions.create(
            **kw, max_tokens=0, stream=True, stream_options={"include_usage": True}
        )
    )
    body = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in body) == choice.text
    assert body[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 0
    r = httpx.post(
        server.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 0}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    assert "echo" in r.json()["error"]["message"]


def test_models_and_health(server):
    models = client(server).models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    r = httpx.get(server.url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok", "ready": 1, "instances": 1}
    r = httpx.head(server.url + "/health")
    assert r.status_code == 200 and r.content == b""


def test_prompt_text_work_runs_off_the_event_loop(server, monkeypatch):
    """Encoding and chat templates run on the server's text thread, never on the event loop
    that streams the other requests' tokens."""
    state = server.server_state
    real = state.tokenizer
    threads: list[str] = []

    class Recording:
        def __getattr__(self, name):
            return getattr(real, name)

        def __call__(self, *args, **kw):
            threads.append(threading.current_thread().name)
            return real(*args, **kw)

        def apply_chat_template(self, *args, **kw):
            threads.append(threading.current_thread().name)
            return real.apply_chat_template(*args, **kw)

    monkeypatch.setattr(state, "tokenizer", Recording())
    c = client(server)
    c.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=1)
    msgs = [{"role": "user", "content": "hi"}]
    c.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=1)
    httpx.post(server.url + "/tokenize", json={"prompt": "Hello world"})
    assert len(threads) == 3
    assert all(name.startswith("pace-text") for name in threads), threads


def test_tokenize_detokenize_and_the_model_card(server):
    url = server.url
    tok = server.server_state.tokenizer
    r = httpx.post(url + "/tokenize", json={"model": MODEL_NAME, "prompt": "Hello world"})
    body = r.json()
    assert r.status_code == 200 and body["tokens"] == tok("Hello world")["input_ids"]
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] > 0
    msgs = [{"role": "user", "content": "hi"}]
    r = httpx.post(url + "/tokenize", json={"messages": msgs, "return_token_strs": True})
    chat = r.json()
    expected = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    assert chat["tokens"] == list(expected["input_ids"])
    assert chat["token_strs"] == tok.convert_ids_to_tokens(chat["tokens"])
    r = httpx.post(url + "/detokenize", json={"model": MODEL_NAME, "tokens": body["tokens"]})
    assert r.status_code == 200 and r.json() == {"prompt": "Hello world"}
    card = httpx.get(f"{url}/v1/models/{MODEL_NAME}").json()
    assert card["id"] == MODEL_NAME and card["object"] == "model"
    for method, path, payload, param in [
        ("post", "/tokenize", {"prompt": "a", "messages": msgs}, "prompt"),
        ("post", "/tokenize", {}, "prompt"),
        ("post", "/tokenize", {"prompt": "a", "model": "nope"}, "model"),
        ("post", "/tokenize", {"prompt": 5}, "prompt"),
        ("post", "/detokenize", {"tokens": [10**8]}, "tokens"),
        ("post", "/detokenize", {"tokens": [-1]}, "tokens.0"),
        ("get", "/v1/models/nope", None, "model"),
    ]:
        r = httpx.request(method, url + path, json=payload)
        assert 400 <= r.status_code < 500, (path, payload, r.text)
        assert r.json()["error"]["param"] == param, (path, payload, r.text)


def test_the_server_listens_once_its_engine_has_warmed_up(llm, monkeypatch):
    """A request during the engine's warm-up would skew the prefill rate it measures, and so
    would the grammar's tokenizer conversion (seconds of CPU for Gemma's vocabulary): uvicorn
    listens, and the conversion starts, only once the warm-up is over."""
    from pace_core.engine.config import EngineConfig
    from pace_core.engine.core import EngineCore
    from pace_core.server.api.app import Server, ServerConfig, create_app
    from pace_core.server.launch.testing import ThreadedServer

    from .conftest import THREADS

    release, order = threading.Event(), []

    def held_warm_up(core):
        order.append("warm-up")
        release.wait(30)
        order.append("warmed")

    monkeypatch.setattr(EngineCore, "warm_up", held_warm_up)
    config = ServerConfig(served_model_name=MODEL_NAME)
    server = Server.in_process(llm, EngineConfig(threads=THREADS), config)
    monkeypatch.setattr(server.grammar, "warm", lambda: order.append("grammar"))
    http = ThreadedServer(create_app(server))
    starter = threading.Thread(target=http.start)
    starter.start()
    try:
        wait_for(lambda: order == ["warm-up"], 30, "the warm-up")
        time.sleep(0.3)
        assert not http.server.started and order == ["warm-up"]
        release.set()
        starter.join(30)
        assert http.server.started
        wait_for(lambda: "grammar" in order, 30, "the grammar conversion")
        assert order == ["warm-up", "warmed", "grammar"]
        http.server_state = server
        assert _complete(http, "Hi", 2).usage.completion_tokens == 2
    finally:
        release.set()
        starter.join(30)
        http.stop()


class _WithBos:
    """A tokenizer that starts every encoding with a special token (as Gemma's adds <bos>)."""

    def __init__(self, tokenizer, bos: int):
        self._tok, self._bos = tokenizer, bos

    def __call__(self, text, **kw):
        out = self._tok(text, **kw)
        return {**out, "input_ids": [self._bos, *out["input_ids"]]}

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_echo_is_the_prompt_as_sent(server, monkeypatch):
    """(Echo decoded the encoded prompt: a model adding <bos> echoed "<bos>The capital ...",
    so ``text[len(prompt):]`` sliced wrong.) With logprobs the echo spells the tokens, special
    ones included, since ``text_offset`` indexes it."""
    state = server.server_state
    bos = state.tokenizer.convert_tokens_to_ids("<|im_start|>")
    monkeypatch.setattr(state, "tokenizer", _WithBos(state.tokenizer, bos))
    c = client(server)
    kw = dict(model=MODEL_NAME, prompt="Hello there", max_tokens=2, temperature=0, echo=True)
    plain = c.completions.create(**kw).choices[0]
    assert plain.text.startswith("Hello there") and "<|im_start|>" not in plain.text
    scored = c.completions.create(**kw, logprobs=1).choices[0]
    assert scored.text.startswith("<|im_start|>Hello there")
    assert scored.logprobs.tokens[0] == "<|im_start|>" and scored.logprobs.text_offset[1] == 12


def test_text_parts_are_joined_with_newlines(server):
    """(They ran together: "Hello" + "world" read "Helloworld".)"""
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]
    msg = [{"role": "user", "content": parts}]
    ids = httpx.post(f"{server.url}/tokenize", json={"messages": msg}, timeout=30).json()["tokens"]
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": ids}, timeout=30).json()["prompt"]
    assert "Hello\nworld" in text
