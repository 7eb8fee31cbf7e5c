"""OpenAI-compatible request models and the error shape.

Validation is strict about types (JSON ``"1"`` is not a number, ``true`` is not an int) and
ranges. A field pace does not know is a 400 naming it (see :func:`check_extra_fields`), except
the few that cannot change the output (:data:`IGNORED_FIELDS`). Requests are parsed
from the raw JSON body with :meth:`pydantic.BaseModel.model_validate_json` so every problem is
answered 400 in the OpenAI error shape (see :func:`error_body`).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from pace_core.sampling.schema import strict_problem

MAX_STOP = 4
MAX_N = 16
MAX_COMPLETION_LOGPROBS = 5
MAX_CHAT_TOP_LOGPROBS = 20

TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
_TOKEN_ID = re.compile(r"[0-9]+")  # a logit_bias key: ASCII digits only


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Strict):
    include_usage: bool = False


class JsonSchemaSpec(_Strict):
    """``response_format.json_schema``: the schema the output must follow."""

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """``response_format``: free text, any JSON object, or JSON following a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    def schema_or_none(self) -> dict[str, Any] | None:
        """The JSON schema the output is constrained to (None for ``text``)."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "object"}
        if self.json_schema is None:
            raise ValueError("response_format of type json_schema needs a json_schema object")
        schema = self.json_schema.schema_ or {"type": "object"}
        if self.json_schema.strict and (problem := strict_problem(schema)) is not None:
            raise ValueError(f"response_format.json_schema.schema is not strict: {problem}")
        return schema


class _Sampling(_Strict):
    """Fields shared by both endpoints."""

    model: str | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_N)
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    user: str | None = None
    # extras (vLLM-style)
    top_k: int | None = Field(None, ge=-1, le=2**31 - 1)  # beyond the vocabulary: all of it
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    response_format: ResponseFormat | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=256)  # prefix-cache tenant

    @field_validator(
        "temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p", mode="before"
    )
    @classmethod
    def _finite(cls, v: Any) -> Any:  # before the range checks, which NaN fails misleadingly
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator("stream_options")
    @classmethod
    def _streamed(cls, v: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if v is not None and not info.data.get("stream", False):
            raise ValueError("stream_options is only allowed with stream: true")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stops or None

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return None
        for key in v:
            if not _TOKEN_ID.fullmatch(key.strip()):  # ASCII digits ("²".isdigit() is True)
                raise ValueError(f"logit_bias keys must be token ids (got {key!r})")
        return v


class CompletionRequest(_Sampling):
    """``POST /v1/completions``."""

    prompt: str | list[TokenIds] | TokenIds | Annotated[list[str], Field(min_length=1)]
    max_tokens: int | None = Field(16, ge=0)  # 0: with echo, score the prompt only
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    suffix: str | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


_FUNCTION_NAME = r"^[a-zA-Z0-9_.-]{1,64}$"


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(_Strict):
    """An assistant message's earlier call (``message.tool_calls[i]``)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDef(_Strict):
    name: str = Field(pattern=_FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content)  # vLLM's join of text parts


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_CHAT_TOP_LOGPROBS)
    add_generation_prompt: bool = True
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True


class TokenizeRequest(_Strict):
    """``POST /tokenize`` (vLLM's shape): a ``prompt`` or chat ``messages``."""

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages
    return_token_strs: bool = False


MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit per request


class EmbeddingRequest(_Strict):
    """``POST /v1/embeddings``: one text or token-id list, or up to 2048 of them."""

    model: str | None = None
    input: Any
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None  # for the caller's records; never changes the output

    @field_validator("input")
    @classmethod
    def _inputs(cls, v: Any) -> list[str] | list[list[int]]:
        """The inputs as a list of texts or of token-id lists."""
        what = "a string, a list of strings, a list of token ids or a list of token-id lists"
        one_list = isinstance(v, list) and v and all(_token_id(t) for t in v)
        if isinstance(v, str) or one_list:
            v = [v]
        if not isinstance(v, list) or not v:
            raise ValueError(f"must be {what} (non-empty)")
        if len(v) > MAX_EMBEDDING_INPUTS:
            raise ValueError(f"has {len(v)} inputs; at most {MAX_EMBEDDING_INPUTS} per request")
        texts = all(isinstance(x, str) for x in v)
        for i, x in enumerate(v):
            if texts and not x:
                raise ValueError(f"item {i} is an empty string")
            if not texts and not (isinstance(x, list) and x and all(_token_id(t) for t in x)):
                raise ValueError(f"item {i} is not a non-empty list of token ids; must be {what}")
        return v


def _token_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


class DetokenizeRequest(_Strict):
    """``POST /detokenize``."""

    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


class APIError(Exception):
    """An error answered in the OpenAI shape with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        instance: str | None = None,
    ) -> None:
        super().__init__(message)
        self.instance = instance  # the engine instance that failed, for the errors metric
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str, type: str = "invalid_request_error", param: str | None = None, code: Any = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def validation_error(exc: ValidationError) -> APIError:
    """The first problem of a pydantic error as a 400 naming the field."""
    errors = exc.errors(include_url=False)
    first = errors[0] if errors else {"loc": (), "msg": str(exc), "type": "invalid"}
    # Union members add their type name to the location; keep the request field path only.
    loc = [str(p) for p in first.get("loc", ()) if not _is_type_tag(p)]
    param = ".".join(loc) or None
    kind = first.get("type", "")
    if kind == "json_invalid":
        return APIError(400, f"request body is not valid JSON: {first.get('msg')}", code=kind)
    message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem(s))"
    return APIError(400, message, param=param, code=kind or None)


def _is_type_tag(part: Any) -> bool:
    text = str(part)
    return (
        text in {"str", "int", "float", "bool", "list[str]", "list[int]"}
        or text.startswith("constrained-")  # an Annotated member, e.g. constrained-str
        or ("[" in text and "]" in text)
    )


IGNORED_FIELDS = frozenset(
    {"metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"}
)
"""Request fields accepted and ignored: bookkeeping that never changes the output."""


def check_extra_fields(req: BaseModel) -> None:
    """A 400 naming the first field the request models do not declare, at any depth; only
    :data:`IGNORED_FIELDS` at the top level are accepted (and ignored)."""
    bad = _first_extra(req, "", IGNORED_FIELDS)
    if bad is not None:
        raise _unsupported(bad)


def _first_extra(value: Any, path: str, allowed: frozenset[str] = frozenset()) -> str | None:
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _first_extra(item, f"{path}.{i}")
            if found is not None:
                return found
        return None
    if not isinstance(value, BaseModel):
        return None
    for name in value.model_extra or {}:
        if name not in allowed:
            return f"{path}.{name}" if path else name
    for name, child in value:
        found = _first_extra(child, f"{path}.{name}" if path else name)
        if found is not None:
            return found
    return None


def _unsupported(name: str) -> APIError:
    return APIError(
        400,
        f"unsupported field {name!r}: pace does not implement it and will not ignore a field "
        f"that may change the output; remove it (see docs/server.md for the supported fields)",
        param=name,
        code="unsupported_field",
    )


def parse(model: type[BaseModel], body: bytes) -> Any:
    """Validate a raw JSON body; any problem becomes a 400 :class:`APIError`."""
    if not body.strip():
        raise APIError(400, "request body is empty: send a JSON object", code="json_invalid")
    try:
        req = model.model_validate_json(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    check_extra_fields(req)
    return req
