"""Structured outputs and tool calls through the OpenAI API (the official client).

Bar: ``response_format`` outputs parse and validate (streamed and not, n > 1, logprobs, stop
strings); ``tool_choice`` ``required`` / named give valid arguments for the tool's schema,
``auto`` is parsed from the model's own format; the client's tool-call round trip works
streamed and not streamed.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from .conftest import MODEL_NAME, client, wait_idle

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"tz": {"type": "string", "maxLength": 30}},
    "required": ["tz"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMA_OF = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "Describe a person as JSON."}]
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _person_format():
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}


@pytest.mark.parametrize("stream", [False, True])
def test_response_format_outputs_validate(server, stream):
    kw = dict(
        model=MODEL_NAME,
        messages=ASK,
        response_format=_person_format(),
        max_tokens=120,
        temperature=1.0,
        seed=7,
        n=3,
        logprobs=True,
        top_logprobs=2,
    )
    texts = ["", "", ""]
    finish = [None] * 3
    if stream:
        for chunk in client(server).chat.completions.create(stream=True, **kw):
            for ch in chunk.choices:
                texts[ch.index] += ch.delta.content or ""
                finish[ch.index] = ch.finish_reason or finish[ch.index]
    else:
        out = client(server).chat.completions.create(**kw)
        for ch in out.choices:
            texts[ch.index], finish[ch.index] = ch.message.content, ch.finish_reason
            tokens = ch.logprobs.content
            assert all(len(t.top_logprobs) == 2 for t in tokens)
            assert "".join(t.token for t in tokens).startswith(ch.message.content)
    for text, reason in zip(texts, finish):
        assert reason == "stop", text
        jsonschema.validate(json.loads(text), PERSON)
    wait_idle(server)


@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_past_the_grammar_engines_limits_is_an_error_not_a_stop(server, stream):
    """3000 optional properties outgrow llguidance's parser rows after the first ``{``: the
    request fails naming the schema (a 400, or streamed an error payload), where the row used
    to end with a forced EOS reported as ``finish_reason: "stop"``."""
    props = {f"p{i}": {"type": "string"} for i in range(3000)}
    fmt = {"type": "json_schema", "json_schema": {"name": "big", "schema": {
        "type": "object", "properties": props}}}  # fmt: skip
    body = {"model": MODEL_NAME, "messages": ASK, "response_format": fmt, "max_tokens": 6,
            "temperature": 0, "stream": stream}  # fmt: skip
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    if stream:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.text.splitlines()
                  if line.startswith("data: {")]  # fmt: skip
        assert "grammar engine gave up" in events[-1]["error"]["message"], events[-1]
        assert all(ch["finish_reason"] != "stop" for e in events for ch in e.get("choices", []))
    else:
        assert r.status_code == 400, r.text
        assert "grammar engine gave up" in r.json()["error"]["message"]
    wait_idle(server)


def test_completions_with_a_schema_and_a_stop_string(server):
    c = client(server)
    kw = dict(model=MODEL_NAME, prompt="A person as JSON:", max_tokens=80, temperature=0)
    fmt = {"response_format": _person_format()}
    out = c.completions.create(extra_body=fmt, **kw)
    text = out.choices[0].text
    jsonschema.validate(json.loads(text), PERSON)
    cut = c.completions.create(stop=[","], extra_body=fmt, **kw)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(",")]


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]


def _stream_calls(stream) -> tuple[str, dict[int, list[str]], str | None]:
    """(content, {index: [id, name, arguments]}, finish_reason) assembled from deltas."""
    content, calls, finish = "", {}, None
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, ["", "", ""])
            entry[0] += tc.id or ""
            entry[1] += (tc.function.name or "") if tc.function else ""
            entry[2] += (tc.function.arguments or "") if tc.function else ""
        finish = chunk.choices[0].finish_reason or finish
    return content, calls, finish


@pytest.mark.parametrize(
    "choice",
    ["required", {"type": "function", "function": {"name": "get_time"}}],
    ids=["required", "named"],
)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_required_and_named_calls_have_valid_arguments(server, choice, temperature):
    c = client(server)
    kw = dict(
        model=MODEL_NAME,
        messages=WEATHER_ASK,
        tools=TOOLS,
        tool_choice=choice,
        max_tokens=120,
        temperature=temperature,
        seed=11,
    )
    out = c.chat.completions.create(**kw)
    ch = out.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    calls = _calls(ch.message)
    assert calls
    for name, args in calls:
        jsonschema.validate(args, SCHEMA_OF[name])
        if isinstance(choice, dict):
            assert name == "get_time"
    content, streamed, finish = _stream_calls(c.chat.completions.create(stream=True, **kw))
    assert finish == "tool_calls" and content == ""
    assert [(s[1], json.loads(s[2])) for _, s in sorted(streamed.items())] == calls
    assert all(s[0].startswith("call_") for s in streamed.values())


def _one_required_call(http):
    """A greedy answer forced to exactly one call (``required``, no parallel calls)."""
    return client(http).chat.completions.create(
        model=MODEL_NAME,
        messages=WEATHER_ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=120,
        temperature=0,
    )


def test_parallel_tool_calls_false_gives_one_call(server):
    assert len(_one_required_call(server).choices[0].message.tool_calls) == 1


def test_auto_and_none_answer_in_text_or_calls(server):
    c = client(server)
    for choice in ("auto", "none"):
        out = c.chat.completions.create(
            model=MODEL_NAME,
            messages=WEATHER_ASK,
            tools=TOOLS,
            tool_choice=choice,
            max_tokens=40,
            temperature=0,
        )
        ch = out.choices[0]
        if choice == "none":  # tools not offered, output not parsed for calls
            assert ch.message.tool_calls is None and ch.finish_reason in ("stop", "length")
        elif ch.message.tool_calls:  # the model chose to call: arguments parse
            assert ch.finish_reason == "tool_calls"
            _calls(ch.message)
        else:
            assert ch.message.content and ch.finish_reason in ("stop", "length")


@pytest.mark.parametrize("stream", [False, True])
def test_client_round_trip_with_a_tool_result(server, stream):
    c = client(server)
    call = _one_required_call(server).choices[0].message
    result = {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "18 C, sunny"}
    history = [*WEATHER_ASK, call.model_dump(exclude_none=True), result]
    kw = dict(model=MODEL_NAME, messages=history, tools=TOOLS, max_tokens=30, temperature=0)
    if stream:
        content, calls, finish = _stream_calls(c.chat.completions.create(stream=True, **kw))
    else:
        out = c.chat.completions.create(**kw)
        content, finish = out.choices[0].message.content or "", out.choices[0].finish_reason
        calls = out.choices[0].message.tool_calls or []
    assert finish in ("stop", "length", "tool_calls")
    assert content or calls
    wait_idle(server)
