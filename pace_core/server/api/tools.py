"""Tool calls on ``/v1/chat/completions``: rendering the tools into the prompt, constraining
``tool_choice`` ``required`` / named with a grammar, and parsing calls out of the output.

A :class:`ToolFormat` is how a model writes calls, detected from its chat template:

* ``hermes`` (Qwen2.5, Hermes, SmolLM3, ...: the template mentions ``<tool_call>``): each call is
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``; the template renders the
  tools itself.
* ``llama3_json`` (Llama 3.1+: the template mentions ``<|python_tag|>``): the whole answer is one
  ``{"name": ..., "parameters": {...}}`` object (no parallel calls).
* ``generic``: the template knows nothing of tools (it would drop them silently), so pace
  writes the tools and the hermes calling convention into the system message itself, and
  renders earlier calls and tool results as text the template can carry.

``required`` and named choices are generated under a Lark grammar (llguidance) whose JSON
bodies follow each tool's ``parameters`` schema, so arguments always parse and validate.
``auto`` leaves the model free and parses what it wrote.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pace_core.sampling.schema import closed_objects, strict_problem
from pace_core.server.api.protocol import APIError, ChatCompletionRequest, ChatMessage, Tool

__all__ = ["ParsedCall", "ToolFormat", "ToolPlan", "ToolStreamParser", "plan_tools"]

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_ANY_OBJECT: dict[str, Any] = {"type": "object"}
_COMPACT = {"whitespace_flexible": False}


@dataclass(frozen=True)
class ToolFormat:
    """How one model family writes tool calls (see module doc)."""

    name: str
    args_key: str  # "arguments" (hermes) or "parameters" (llama 3)
    tagged: bool  # calls wrapped in <tool_call> tags
    template_renders_tools: bool

    @classmethod
    def detect(cls, chat_template: str | None) -> ToolFormat:
        template = chat_template or ""
        if CALL_OPEN in template:
            return HERMES
        if "<|python_tag|>" in template:
            return LLAMA3_JSON
        return GENERIC


HERMES = ToolFormat("hermes", "arguments", tagged=True, template_renders_tools=True)
LLAMA3_JSON = ToolFormat("llama3_json", "parameters", tagged=False, template_renders_tools=True)
GENERIC = ToolFormat("generic", "arguments", tagged=True, template_renders_tools=False)


@dataclass(frozen=True)
class ParsedCall:
    """One call the model made: its id, the tool's name and the arguments as JSON text."""

    id: str
    name: str
    arguments: str

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return out if index is None else {"index": index, **out}


@dataclass
class ToolPlan:
    """What a chat request's tools change: the messages and template arguments to render,
    the grammar (Lark) for ``required`` / named choices, and how to parse the output."""

    messages: list[dict[str, Any]]
    template_tools: list[dict[str, Any]] | None
    grammar: str | None
    format: ToolFormat | None  # None: the output is not parsed for calls (no tools / "none")


def plan_tools(req: ChatCompletionRequest, chat_template: str | None) -> ToolPlan:
    """The :class:`ToolPlan` of ``req`` for a model with ``chat_template``."""
    fmt = ToolFormat.detect(chat_template)
    tools = req.tools or []
    for i, tool in enumerate(tools):
        params = tool.function.parameters or _ANY_OBJECT
        if tool.function.strict and (problem := strict_problem(params)) is not None:
            raise APIError(
                400,
                f"tool {tool.function.name!r} has strict parameters that break strict mode: "
                f"{problem}",
                param=f"tools[{i}].function.parameters",
            )
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    if choice != "none" and not tools:
        raise APIError(400, "tool_choice needs a non-empty tools list", param="tool_choice")
    if choice not in ("none", "auto", "required"):
        name = choice.function.name  # type: ignore[union-attr]
        chosen = [t for t in tools if t.function.name == name]
        if not chosen:
            names = ", ".join(t.function.name for t in tools)
            raise APIError(
                400,
                f"tool_choice names {name!r}, which is not in tools ({names})",
                param="tool_choice",
            )
        tools_for_grammar: list[Tool] | None = chosen
    else:
        tools_for_grammar = tools if choice == "required" else None
    if choice == "none":
        return ToolPlan(render_messages(req.messages, fmt), None, None, None)
    parallel = req.parallel_tool_calls and fmt is not LLAMA3_JSON
    grammar = None
    if tools_for_grammar is not None:
        grammar = calls_grammar(tools_for_grammar, fmt, parallel)
    messages = render_messages(req.messages, fmt)
    template_tools = [t.model_dump(exclude_none=True) for t in tools]
    if not fmt.template_renders_tools:
        messages = with_tool_prompt(messages, tools, parallel)
        template_tools = None
    return ToolPlan(messages, template_tools, grammar, fmt)


# -- rendering ---------------------------------------------------------------------------------
def render_messages(messages: Sequence[ChatMessage], fmt: ToolFormat) -> list[dict[str, Any]]:
    """The chat template's input: earlier calls with their arguments as objects (what
    templates expect); for ``generic`` templates calls and results written out as text."""
    out = []
    for m in messages:
        item: dict[str, Any] = {"role": m.role, "content": m.text()}
        calls = [
            {"name": c.function.name, "arguments": _loads_or_text(c.function.arguments)}
            for c in m.tool_calls or []
        ]
        if fmt.template_renders_tools:
            if calls:
                item["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": f}
                    for c, f in zip(m.tool_calls or [], calls)
                ]
            if m.tool_call_id is not None:
                item["tool_call_id"] = m.tool_call_id
        else:  # calls and results written out, each result naming its call's id
            if calls:
                written = [{"id": tc.id, **c} for tc, c in zip(m.tool_calls or [], calls)]
                text = "\n".join(_tagged(json.dumps(c)) for c in written)
                item["content"] = (item["content"] + "\n" + text).strip()
            if m.role == "tool":
                ref = "" if m.tool_call_id is None else f"tool_call_id: {m.tool_call_id}\n"
                item = {
                    "role": "user",
                    "content": f"<tool_response>\n{ref}{m.text()}\n</tool_response>",
                }
        if m.name is not None:
            item["name"] = m.name
        out.append(item)
    return out


def with_tool_prompt(
    messages: list[dict[str, Any]], tools: Sequence[Tool], parallel: bool
) -> list[dict[str, Any]]:
    """``messages`` with the tools and the calling convention in the system message."""
    listing = "\n".join(json.dumps(t.model_dump(exclude_none=True)) for t in tools)
    many = " You may call several tools, one tag each." if parallel else ""
    prompt = (
        "You can call these tools (JSON signatures):\n<tools>\n"
        f"{listing}\n</tools>\n"
        "To call a tool, answer with its name and arguments as JSON inside tags:\n"
        f'{CALL_OPEN}\n{{"name": <tool name>, "arguments": <arguments object>}}\n{CALL_CLOSE}'
        f"{many} Otherwise answer normally."
    )
    if messages and messages[0]["role"] in ("system", "developer"):
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{prompt}".strip()}
        return [first, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def _tagged(body: str) -> str:
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def _loads_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


# -- the grammar of required / named choices ---------------------------------------------------
def calls_grammar(tools: Sequence[Tool], fmt: ToolFormat, parallel: bool) -> str:
    """A Lark grammar (llguidance dialect) accepting one call (or several when ``parallel``)
    of ``tools`` in ``fmt``, each body JSON valid for that tool's parameters."""
    bodies = []
    for tool in tools:
        schema = {
            "type": "object",
            "properties": {
                "name": {"const": tool.function.name},
                fmt.args_key: closed_objects(tool.function.parameters or _ANY_OBJECT),
            },
            "required": ["name", fmt.args_key],
            "additionalProperties": False,
            "x-guidance": _COMPACT,
        }
        bodies.append(f"%json {json.dumps(schema)}")
    rules = ["body: " + "\n    | ".join(bodies)]
    if fmt.tagged:
        open_tag, close_tag = json.dumps(CALL_OPEN + "\n"), json.dumps("\n" + CALL_CLOSE)
        rules.append(f"call: {open_tag} body {close_tag}")
        rules.insert(0, 'start: call ("\\n" call)*' if parallel else "start: call")
    else:
        rules.insert(0, "start: body")
    return "\n".join(rules) + "\n"


# -- parsing -----------------------------------------------------------------------------------
def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_call(body: str, fmt: ToolFormat) -> ParsedCall | None:
    """A call from one JSON body (``{"name", "arguments"|"parameters"}``), else None."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(fmt.args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        args = _loads_or_text(args)
    return ParsedCall(_call_id(), obj["name"], json.dumps(args, ensure_ascii=False))


_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


def partial_call(body: str, fmt: ToolFormat) -> ParsedCall:
    """A call cut off before its end (``max_tokens``): the name when the model wrote it, and
    the arguments as far as they were generated (JSON text, possibly incomplete; complete
    arguments end where their JSON value ends, without the rest of the call's wrapper)."""
    found = _NAME.search(body)
    name = _loads_or_text(f'"{found.group(1)}"') if found else ""
    keys = "|".join(re.escape(k) for k in dict.fromkeys((fmt.args_key, "arguments", "parameters")))
    start = re.search(rf'"(?:{keys})"\s*:\s*', body)
    arguments = ""
    if start is not None:
        try:
            end = json.JSONDecoder().raw_decode(body, start.end())[1]
        except ValueError:  # cut inside the arguments
            end = len(body)
        arguments = body[start.end() : end]
    return ParsedCall(_call_id(), name if isinstance(name, str) else "", arguments)


class ToolStreamParser:
    """Splits a choice's text, as it streams, into content and finished tool calls.

    :meth:`feed` returns ``(content, calls)`` for the new text: content is released as soon
    as it cannot be the start of a call; a call is released when its closing tag arrives (a
    tagged format) or at :meth:`finish` (llama 3 JSON, or a call the model never closed).
    Text that looked like a call but does not parse is released as content."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self.calls: list[ParsedCall] = []
        self._pending = ""  # text not yet released
        self._in_call = False
        self._json_answer: bool | None = None  # llama 3: the answer is a JSON call

    def feed(self, text: str) -> tuple[str, list[ParsedCall]]:
        self._pending += text
        if self.fmt.tagged:
            return self._scan_tagged(final=False)
        return self._scan_json(final=False)

    def finish(self) -> tuple[str, list[ParsedCall]]:
        if self.fmt.tagged:
            return self._scan_tagged(final=True)
        return self._scan_json(final=True)

    def _scan_tagged(self, final: bool) -> tuple[str, list[ParsedCall]]:
        content, calls = [], []
        while self._pending:
            if not self._in_call and (self.calls or calls):
                self._pending = self._pending.lstrip()  # whitespace between calls
                if not self._pending:
                    break
            if not self._in_call:
                at = self._pending.find(CALL_OPEN)
                if at < 0:
                    keep = 0 if final else _partial_suffix(self._pending, CALL_OPEN)
                    cut = len(self._pending) - keep
                    content.append(self._pending[:cut])
                    self._pending = self._pending[cut:]
                    break
                content.append(self._pending[:at])
                self._pending = self._pending[at + len(CALL_OPEN) :]
                self._in_call = True
            end = self._pending.find(CALL_CLOSE)
            if end < 0 and not final:
                break
            body = self._pending if end < 0 else self._pending[:end]
            call = parse_call(body.strip(), self.fmt)
            if call is None and end < 0:  # cut off (max_tokens): the call as far as it got
                calls.append(partial_call(body, self.fmt))
            elif call is None:  # a closed block that is no call: the model's text
                content.append(CALL_OPEN + body + CALL_CLOSE)
            else:
                calls.append(call)
            self._pending = "" if end < 0 else self._pending[end + len(CALL_CLOSE) :]
            self._in_call = False
        self.calls += calls
        text = "".join(content)
        return (text.strip() if self.calls and final else text), calls

    def _scan_json(self, final: bool) -> tuple[str, list[ParsedCall]]:
        if self._json_answer is None:
            head = self._pending.lstrip()
            if not head and not final:
                return "", []
            self._json_answer = head.startswith("{")
        if not self._json_answer:
            text, self._pending = self._pending, ""
            return text, []
        if not final:
            return "", []
        text, self._pending = self._pending, ""
        parts = text.split(";")
        calls = [parse_call(part, self.fmt) for part in parts]
        if calls[-1] is None and all(calls[:-1]) and _NAME.search(parts[-1]):
            calls[-1] = partial_call(parts[-1], self.fmt)  # cut off mid-call
        if not calls or any(c is None for c in calls):
            return text, []
        found = [c for c in calls if c is not None]
        self.calls += found
        return "", found


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
