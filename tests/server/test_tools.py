"""Tool-call formats: detection, rendering, the required/named grammar, streaming parsing."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from pace_core.sampling.config import SamplingConfig
from pace_core.sampling.grammar import GrammarCompiler
from pace_core.server.api.protocol import ChatCompletionRequest, ChatMessage, Tool
from pace_core.server.api.tools import (
    GENERIC,
    HERMES,
    LLAMA3_JSON,
    ToolFormat,
    ToolStreamParser,
    calls_grammar,
    plan_tools,
    render_messages,
)

# A Qwen2.5-style template: tools in the system prompt, calls as <tool_call> blocks.
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}"
    "{% endfor %}\nCall with <tool_call></tool_call>.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>"
    "{% endfor %}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
)
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]


def _req(**kw) -> ChatCompletionRequest:
    messages = kw.pop("messages", [{"role": "user", "content": "weather in Paris?"}])
    return ChatCompletionRequest.model_validate({"messages": messages, "tools": TOOLS, **kw})


def test_formats_are_detected_from_the_template():
    assert ToolFormat.detect(HERMES_TEMPLATE) is HERMES
    assert ToolFormat.detect("{{ '<|python_tag|>' }}{{ tools }}") is LLAMA3_JSON
    assert ToolFormat.detect("{% for m in messages %}{{ m.content }}{% endfor %}") is GENERIC
    assert ToolFormat.detect(None) is GENERIC


def _feed_in_pieces(parser: ToolStreamParser, text: str, size: int) -> tuple[str, list]:
    content, calls = "", []
    for i in range(0, len(text), size):
        c, k = parser.feed(text[i : i + size])
        content, calls = content + c, calls + k
    c, k = parser.finish()
    return content + c, calls + k


@pytest.mark.parametrize("size", [1, 3, 1000])
def test_hermes_stream_splits_content_and_calls_in_any_pieces(size):
    text = (
        'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'
    )
    parser = ToolStreamParser(HERMES)
    content, calls = _feed_in_pieces(parser, text, size)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"tz": "CET"}),
    ]
    assert len({c.id for c in calls}) == 2


def test_partial_tag_is_held_back_until_it_is_not_a_tag():
    parser = ToolStreamParser(HERMES)
    assert parser.feed("a <tool_") == ("a ", [])
    assert parser.feed("box> b") == ("<tool_box> b", [])


def test_unparsable_or_unclosed_blocks():
    parser = ToolStreamParser(HERMES)
    content, calls = _feed_in_pieces(parser, "<tool_call>not json</tool_call> ok", 4)
    assert calls == [] and content == "<tool_call>not json</tool_call> ok"
    parser = ToolStreamParser(HERMES)
    content, calls = _feed_in_pieces(parser, '<tool_call>{"name": "f", "arguments": {}}', 5)
    assert content == "" and [c.name for c in calls] == ["f"]  # EOS before the closing tag


def test_a_call_cut_off_by_max_tokens_is_a_partial_call_not_content():
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    content, calls = _feed_in_pieces(ToolStreamParser(HERMES), "Sure. " + cut, 6)
    assert content.strip() == "Sure."  # no template markup in the content
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Par')]
    content, calls = _feed_in_pieces(ToolStreamParser(HERMES), "<tool_call>\n{", 3)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("", "")]
    cut = '<tool_call>\n{"name": "f", "arguments": {"a": 100}}\n</tool_'  # only the tag cut
    content, calls = _feed_in_pieces(ToolStreamParser(HERMES), cut, 4)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("f", '{"a": 100}')]
    cut = '{"name": "get_weather", "parameters": {"ci'
    content, calls = _feed_in_pieces(ToolStreamParser(LLAMA3_JSON), cut, 5)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("get_weather", '{"ci')]


def test_llama3_json_answer():
    parser = ToolStreamParser(LLAMA3_JSON)
    text = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    content, calls = _feed_in_pieces(parser, text, 7)
    assert content == "" and json.loads(calls[0].arguments) == {"city": "Oslo"}
    content, calls = _feed_in_pieces(ToolStreamParser(LLAMA3_JSON), "It is sunny.", 4)
    assert content == "It is sunny." and calls == []


def test_hermes_template_gets_the_tools_and_calls_as_objects():
    history = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "20 C"},
    ]
    plan = plan_tools(_req(messages=history), HERMES_TEMPLATE)
    assert plan.format is HERMES and plan.grammar is None
    assert plan.template_tools[0]["function"]["name"] == "get_weather"
    call = plan.messages[1]["tool_calls"][0]["function"]
    assert call["arguments"] == {"city": "Rome"}  # an object, as templates expect
    assert plan.messages[2]["tool_call_id"] == "call_1"


def test_generic_template_gets_a_tool_prompt_and_text_history():
    messages = [
        ChatMessage(
            role="assistant",
            tool_calls=[
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        ),
        ChatMessage(role="tool", tool_call_id="c", content="42"),
    ]
    rendered = render_messages(messages, GENERIC)
    assert (
        rendered[0]["content"].startswith("<tool_call>\n")
        and '"name": "f"' in rendered[0]["content"]
    )
    assert '"id": "c"' in rendered[0]["content"]
    assert rendered[1] == {
        "role": "user",
        "content": "<tool_response>\ntool_call_id: c\n42\n</tool_response>",
    }
    plan = plan_tools(_req(), "{{ messages }}")
    assert plan.format is GENERIC and plan.template_tools is None
    assert plan.messages[0]["role"] == "system" and "get_weather" in plan.messages[0]["content"]


@pytest.mark.parametrize("fmt", [HERMES, LLAMA3_JSON])
@pytest.mark.parametrize("parallel", [False, True])
def test_required_grammar_accepts_valid_calls_only(smollm2_dir, fmt, parallel):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    tools = [Tool.model_validate(t) for t in TOOLS]
    grammar = calls_grammar(tools, fmt, parallel and fmt.tagged)
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    compiler.check(SamplingConfig(grammar=grammar))
    body = json.dumps(
        {"name": "get_weather", fmt.args_key: {"city": "Paris"}}, separators=(",", ":")
    )
    good = f"<tool_call>\n{body}\n</tool_call>" if fmt.tagged else body
    bad = good.replace('"Paris"', "7")
    for text, ok in [(good, True), (bad, False)]:
        row = compiler.row(SamplingConfig(grammar=grammar))
        ids = tokenizer.encode(text, add_special_tokens=False)
        accepted = row._matcher.try_consume_tokens(ids)
        assert (accepted == len(ids) and row._matcher.is_accepting()) is ok, text


def test_named_choice_must_exist_and_tools_need_a_list():
    from pace_core.server.api.protocol import APIError

    with pytest.raises(APIError, match="not in tools"):
        plan_tools(_req(tool_choice={"type": "function", "function": {"name": "nope"}}), None)
    with pytest.raises(APIError, match="non-empty tools"):
        plan_tools(
            ChatCompletionRequest.model_validate(
                {"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}
            ),
            None,
        )
