"""OpenAI-compatible request models and the error shape.

Validation is strict about types (JSON ``"1"`` is not a number, ``true`` is not an int) and
ranges, lenient about unknown fields (ignored, as the OpenAI API does). Requests are parsed
from the raw JSON body with :meth:`pydantic.BaseModel.model_validate_json` so every problem is
answered 400 in the OpenAI error shape (see :func:`error_body`).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

MAX_STOP = 4
MAX_N = 16
MAX_COMPLETION_LOGPROBS = 5
MAX_CHAT_TOP_LOGPROBS = 20

TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class StreamOptions(_Strict):
    include_usage: bool = False


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
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)

    @field_validator("temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
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
            if not key.strip().isdigit():
                raise ValueError(f"logit_bias keys must be token ids (got {key!r})")
        return v


class CompletionRequest(_Sampling):
    """``POST /v1/completions``."""

    prompt: str | list[TokenIds] | TokenIds | Annotated[list[str], Field(min_length=1)]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    suffix: str | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_CHAT_TOP_LOGPROBS)
    add_generation_prompt: bool = True


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
    return text in {"str", "int", "float", "bool", "list[str]", "list[int]"} or (
        "[" in text and "]" in text
    )


def parse(model: type[BaseModel], body: bytes) -> Any:
    """Validate a raw JSON body; any problem becomes a 400 :class:`APIError`."""
    if not body.strip():
        raise APIError(400, "request body is empty: send a JSON object", code="json_invalid")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
