"""Every invalid request is a 4xx in the OpenAI error shape, never a 5xx."""

from __future__ import annotations

import httpx
import pytest

from pace_core.server.api.openai_request import max_tokens

from .conftest import CACHE_TOKENS, MODEL_NAME, serve

P = "/v1/completions"
C = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


def _ok(**kw):
    return {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2, **kw}


def _chat(**kw):
    return {"model": MODEL_NAME, "messages": MSG, "max_tokens": 2, **kw}


def _schema_format(name="answer", schema=None):
    spec = {"schema": schema or {"type": "object"}}
    if name is not None:
        spec["name"] = name
    return {"type": "json_schema", "json_schema": spec}


def _tool(name):
    params = {"type": "object", "properties": {"x": {"type": "integer"}}}
    return {"type": "function", "function": {"name": name, "parameters": params}}


def _named(name):
    return {"type": "function", "function": {"name": name}}


# (id, path, body (dict = JSON, bytes = raw), status, param or None)
CASES = [
    ("malformed-json", P, b'{"prompt": "hi",', 400, None),
    ("not-an-object", P, b"[1, 2, 3]", 400, None),
    ("empty-body", P, b"", 400, None),
    ("missing-prompt", P, {"model": MODEL_NAME}, 400, "prompt"),
    ("prompt-wrong-type", P, _ok(prompt=5), 400, "prompt"),
    ("prompt-mixed-list", P, _ok(prompt=[1, "a"]), 400, "prompt"),
    ("empty-prompt", P, _ok(prompt=""), 400, "prompt"),
    ("empty-prompt-list", P, _ok(prompt=[]), 400, "prompt"),
    ("negative-token", P, _ok(prompt=[1, -2]), 400, "prompt"),
    ("token-outside-vocab", P, _ok(prompt=[1, 10**7]), 400, "prompt"),
    ("max-tokens-string", P, _ok(max_tokens="16"), 400, "max_tokens"),
    ("max-tokens-zero", P, _ok(max_tokens=0), 400, "max_tokens"),
    ("max-tokens-float", P, _ok(max_tokens=1.5), 400, "max_tokens"),
    ("temperature-3", P, _ok(temperature=3), 400, "temperature"),
    ("temperature-negative", P, _ok(temperature=-0.1), 400, "temperature"),
    ("temperature-string", P, _ok(temperature="hot"), 400, "temperature"),
    ("top-p-0", P, _ok(top_p=0), 400, "top_p"),
    ("top-p-above-1", P, _ok(top_p=1.5), 400, "top_p"),
    ("top-k-past-int64", P, _ok(top_k=2**63), 400, "top_k"),  # was an overflow, param null
    ("n-0", P, _ok(n=0), 400, "n"),
    ("n-bool", P, _ok(n=True), 400, "n"),
    ("too-many-stops", P, _ok(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    ("empty-stop", P, _ok(stop=[""]), 400, "stop"),
    ("stop-wrong-type", P, _ok(stop=5), 400, "stop"),
    ("presence-penalty-3", P, _ok(presence_penalty=3), 400, "presence_penalty"),
    ("frequency-penalty-low", P, _ok(frequency_penalty=-2.5), 400, "frequency_penalty"),
    ("logprobs-6", P, _ok(logprobs=6), 400, "logprobs"),
    ("logit-bias-key", P, _ok(logit_bias={"abc": 1}), 400, "logit_bias"),
    ("logit-bias-range", P, _ok(logit_bias={"5": 101}), 400, "logit_bias.5"),
    ("logit-bias-vocab", P, _ok(logit_bias={"99999999": 1}), 400, "logit_bias"),
    ("logit-bias-superscript-digit", P, _ok(logit_bias={"\u00b2": 1}), 400, "logit_bias"),
    ("logit-bias-fullwidth-digit", C, _chat(logit_bias={"\uff15": 1}), 400, "logit_bias"),
    ("seed-negative", P, _ok(seed=-1), 400, "seed"),
    ("stream-string", P, _ok(stream="yes"), 400, "stream"),
    ("stream-options-type", P, _ok(stream_options={"include_usage": "y"}), 400, None),
    ("stream-options-unstreamed", P, _ok(stream_options={"include_usage": True}), 400,
     "stream_options"),
    ("temperature-nan", P, b'{"prompt": "hi", "max_tokens": 2, "temperature": NaN}', 400,
     "temperature"),
    ("min-tokens-over-max", P, _ok(min_tokens=5, max_tokens=2), 400, "min_tokens"),
    ("best-of-mismatch", P, _ok(best_of=3), 400, "best_of"),
    ("functions-legacy", C, _chat(functions=[{"name": "f"}]), 400, "functions"),
    ("response-format-type", C, _chat(response_format={"type": "xml"}), 400, None),
    ("json-schema-missing", C, _chat(response_format={"type": "json_schema"}), 400, None),
    ("json-schema-no-name", C, _chat(response_format=_schema_format(name=None)), 400, None),
    ("json-schema-bad-type", C, _chat(response_format=_schema_format(schema={"type": "foo"})),
     400, "response_format"),
    ("json-schema-bad-ref", P, _ok(response_format=_schema_format(schema={"$ref": "#/nope"})),
     400, "response_format"),
    ("json-schema-strict-optional", C, _chat(response_format={"type": "json_schema",
     "json_schema": {"name": "a", "strict": True, "schema": _tool("f")["function"]["parameters"]}}),
     400, "response_format"),
    ("json-schema-strict-properties-type", C, _chat(response_format={"type": "json_schema",
     "json_schema": {"name": "a", "strict": True, "schema": {"type": "object", "properties": 5}}}),
     400, "response_format"),
    ("tool-strict-required-type", C, _chat(tools=[{"type": "function", "function": {"name": "f",
     "strict": True, "parameters": {"type": "object", "properties": {"a": {}}, "required": 7}}}]),
     400, "tools[0].function.parameters"),
    ("tool-strict-optional", C, _chat(tools=[{"type": "function", "function": {**_tool("f")[
     "function"], "strict": True}}]), 400, "tools[0].function.parameters"),
    ("tool-choice-without-tools", C, _chat(tool_choice="required"), 400, "tool_choice"),
    ("tool-choice-unknown-name", C, _chat(tools=[_tool("f")], tool_choice=_named("g")), 400,
     "tool_choice"),
    ("tool-bad-name", C, _chat(tools=[_tool("no spaces")]), 400, None),
    ("tool-type", C, _chat(tools=[{"type": "code", "function": {"name": "f"}}]), 400, None),
    ("tool-choice-and-schema", C, _chat(tools=[_tool("f")], tool_choice="required",
     response_format={"type": "json_object"}), 400, "response_format"),
    ("schema-and-ignore-eos", C, _chat(response_format={"type": "json_object"},
     ignore_eos=True), 400, None),
    ("suffix", P, _ok(suffix="x"), 400, "suffix"),
    ("too-many-sequences", P, _ok(prompt=["a"] * 20, n=16), 400, "n"),
    ("over-context", P, _ok(max_tokens=9000), 400, "max_tokens"),
    ("over-kv-pool", P, _ok(max_tokens=4000), 400, "max_tokens"),
    ("unknown-model", P, _ok(model="gpt-4"), 404, "model"),
    ("chat-missing-messages", C, {"model": MODEL_NAME}, 400, "messages"),
    ("chat-empty-messages", C, _chat(messages=[]), 400, "messages"),
    ("chat-bad-role", C, _chat(messages=[{"role": "wizard", "content": "x"}]), 400, None),
    ("chat-content-type", C, _chat(messages=[{"role": "user", "content": 3}]), 400, None),
    ("chat-top-logprobs-21", C, _chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    ("chat-top-logprobs-alone", C, _chat(top_logprobs=2), 400, "top_logprobs"),
    ("chat-logprobs-int", C, _chat(logprobs=3), 400, "logprobs"),
    ("chat-over-context", C, _chat(max_completion_tokens=9000), 400, "max_tokens"),
    ("chat-unknown-model", C, _chat(model="nope"), 404, "model"),
    ("tokenize-prompt-with-tools", "/tokenize", {"prompt": "a", "tools": [_tool("f")]}, 400,
     "tools"),
    ("tokenize-prompt-generation-prompt", "/tokenize", {"prompt": "a",
     "add_generation_prompt": False}, 400, "add_generation_prompt"),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_invalid_requests(server, path, body, status, param):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(
        server.url + path, headers={"content-type": "application/json"}, timeout=30, **kw
    )
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and isinstance(err["message"], str)
    if param is not None:
        assert err["param"] == param, err


def test_default_max_tokens_fit_context_and_kv_pool(server):
    state = server.server_state
    assert max_tokens(state, None, 10, None) == CACHE_TOKENS - 10  # clamped to the KV pool
    assert max_tokens(state, None, 10, 1024) == 1024  # chat default
    assert max_tokens(state, 5, 10, 1024) == 5


def test_null_max_tokens_is_the_server_default(server):
    """``max_tokens: null`` is the server's default budget on both endpoints, never the whole
    context window (seen through the min_tokens check that quotes the budget)."""
    default = server.server_state.config.default_max_tokens
    for path, body in ((P, _ok(max_tokens=None, min_tokens=5000)),
                       (C, _chat(max_tokens=None, min_tokens=5000))):  # fmt: skip
        r = httpx.post(server.url + path, json=body, timeout=30)
        err = r.json()["error"]
        assert r.status_code == 400 and f"max_tokens={default}" in err["message"], r.text
        assert err["param"] == "min_tokens" and "new_tokens" not in err["message"]


def test_unknown_fields_are_400_but_bookkeeping_fields_are_accepted(server):
    r = httpx.post(server.url + P, json=_ok(frobnicate=True), timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "frobnicate" and err["code"] == "unsupported_field"
    nested = _chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}])
    r = httpx.post(server.url + C, json=nested, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.content.0.x"
    fine = _ok(user="u1", metadata={"k": "v"}, store=False, service_tier="auto")
    r = httpx.post(server.url + P, json=fine, timeout=30)
    assert r.status_code == 200, r.text


def test_unknown_route_and_method(server):
    r = httpx.get(server.url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(server.url + P)
    assert r.status_code == 405 and "error" in r.json()


def test_api_key_and_size_limit(llm):
    with serve(llm, api_key="sekrit", max_request_bytes=2000) as http:
        url = http.url + P
        r = httpx.post(url, json=_ok())
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.post(url, json=_ok(), headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        good = {"Authorization": "Bearer sekrit"}
        assert httpx.post(url, json=_ok(), headers=good, timeout=30).status_code == 200
        assert httpx.get(http.url + "/v1/models", headers=good).status_code == 200
        assert httpx.get(http.url + "/v1/models").status_code == 401
        assert httpx.get(http.url + "/health").status_code == 200  # health stays open
        r = httpx.post(url, json=_ok(prompt="x" * 5000), headers=good)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

        def chunks():  # no Content-Length: the limit is enforced while reading
            yield b'{"prompt": "'
            for _ in range(10):
                yield b"x" * 500
            yield b'"}'

        r = httpx.post(url, content=chunks(), headers=good)
        assert r.status_code == 413


def test_no_chat_template_is_400(llm):
    saved = llm.tokenizer.chat_template
    llm.tokenizer.chat_template = None
    try:
        with serve(llm) as http:
            r = httpx.post(http.url + C, json=_chat())
            assert r.status_code == 400
            assert r.json()["error"]["code"] == "no_chat_template"
    finally:
        llm.tokenizer.chat_template = saved
