"""Engine output -> OpenAI responses: the JSON bodies, the SSE chunks of a stream, logprobs
and ``usage``.

:class:`CompletionFormat` (``text_completion``) and :class:`ChatFormat` (``chat.completion``)
turn :class:`~pace_core.engine.events.Token` events into stream chunks and the collected
:class:`Choice` s into a body; :mod:`pace_core.server.api.delivery` drives them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import TYPE_CHECKING, Any

from pace_core.engine.detokenize import IncrementalDetokenizer
from pace_core.engine.events import Token
from pace_core.engine.output import TokenLogprob
from pace_core.server.api.openai_request import Plan, Submitted
from pace_core.server.api.protocol import ChatCompletionRequest, CompletionRequest
from pace_core.server.api.tools import ToolStreamParser
from pace_core.server.frontdoor.context import ServingContext
from pace_core.speculative.stats import SpecStats

if TYPE_CHECKING:
    from pace_core.server.frontdoor.frontend import Submission


def _finite(x: float | None) -> float | None:
    if x is None:
        return None
    return x if math.isfinite(x) else -9999.0


def sse(payload: Any) -> bytes:
    """One server-sent event carrying ``payload`` as compact JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def usage(
    server: ServingContext,
    sub: Submission,
    prompt_tokens: int,
    completion_tokens: int,
    n: int = 1,
) -> dict:
    """OpenAI ``usage`` with ``prompt_tokens_details.cached_tokens`` (prompt tokens whose KV
    came from the prefix cache, counted on each prompt's first choice); with speculative
    decoding plus ``spec_decode``: the request's counters
    (:class:`~pace_core.speculative.stats.SpecStats`, all choices summed; an extra field,
    which the OpenAI client keeps in ``usage.model_extra``)."""
    cached = sum(sub.cached.get(key, 0) for key in sub.keys[::n])
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    if server.speculative:
        stats = (sub.spec or SpecStats()).to_dict()
        out["spec_decode"] = {k: v for k, v in stats.items() if not k.endswith("_seconds")}
    return out


class Choice:
    """Accumulates one choice (sequence) of a non-streaming response."""

    __slots__ = ("finish", "logprobs", "text", "tokens")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.tokens = 0
        self.logprobs: list[Token] = []  # the tokens that carry logprobs
        self.finish: str | None = None

    def add(self, ev: Token) -> None:
        self.text.append(ev.text)
        self.tokens += 1
        if ev.logprob is not None:
            self.logprobs.append(ev)
        self.finish = ev.finish_reason or self.finish


# -- logprobs ----------------------------------------------------------------------------------
class CompletionLogprobs:
    """OpenAI completions logprobs: tokens, token_logprobs, top_logprobs, text_offset.

    ``text_offset`` indexes the choice's text: an echoed prompt token's is where its text
    starts in the echo, a generated token's where the text it released starts (after the
    echo, ``offset`` characters in); a token holding part of a character points at the
    character's start."""

    def __init__(self, server: ServingContext, offset: int) -> None:
        self.tt = server.token_text
        self.offset = offset

    def build(self, echoed: list[Token], own: list[Token]) -> dict[str, Any]:
        offsets = []
        if echoed:  # as the echo was decoded (special tokens kept)
            detok, done = IncrementalDetokenizer(self.tt.tokenizer, skip_special_tokens=False), 0
            for ev in echoed:
                offsets.append(done)
                done += len(detok.add(ev.token))
        for ev in own:
            offsets.append(self.offset)
            self.offset += len(ev.text)
        tokens, lps, tops = [], [], []
        for ev in (*echoed, *own):
            tokens.append(self.tt.get(ev.token)[0])
            lps.append(_finite(ev.logprob))
            top = {}
            for i, v in zip(ev.top_ids or (), ev.top_logprobs or ()):
                if i >= 0:
                    top[self.tt.get(i)[0]] = _finite(v)
            tops.append(top if ev.logprob is not None else None)  # a prompt's first token
        return {
            "tokens": tokens,
            "token_logprobs": lps,
            "top_logprobs": tops,
            "text_offset": offsets,
        }


def chat_logprobs(server: ServingContext, items: list[Token]) -> dict[str, Any]:
    tt = server.token_text
    content = []
    for ev in items:
        text, data = tt.get(ev.token)
        top = []
        for i, v in zip(ev.top_ids or (), ev.top_logprobs or ()):
            if i >= 0:
                t, b = tt.get(i)
                top.append({"token": t, "logprob": _finite(v), "bytes": b})
        content.append(
            {"token": text, "logprob": _finite(ev.logprob), "bytes": data, "top_logprobs": top}
        )
    return {"content": content}


# -- the two response shapes -------------------------------------------------------------------
class ResponseFormat:
    """What :mod:`~pace_core.server.api.delivery` needs to answer one request."""

    object_name = ""
    id_prefix = ""

    def __init__(self, server: ServingContext, req: Any, plan: Plan, submitted: Submitted) -> None:
        self.server = server
        self.req = req
        self.plan = plan
        self.submitted = submitted
        self.stream = req.stream
        self.include_usage = bool(
            req.stream and req.stream_options and req.stream_options.include_usage
        )
        self.base = {
            "id": f"{self.id_prefix}-{submitted.rid}",
            "object": self.object_name,
            "created": int(time.time()),
            "model": server.config.served_model_name,
        }

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        sub, prompt_tokens = self.submitted.sub, self.plan.prompt_tokens
        return usage(self.server, sub, prompt_tokens, completion_tokens, self.plan.n)

    def _wrap(self, choice: dict[str, Any]) -> dict[str, Any]:
        out = {**self.base, "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return out

    # stream pieces
    def opening(self) -> bytes:
        """Sent before the first token."""
        return b""

    def chunk(self, i: int, ev: Token) -> dict[str, Any] | None:
        raise NotImplementedError

    def finish_chunk(self, i: int, reason: str) -> dict[str, Any] | None:
        return None

    def prompt_logprobs(self, key: str, entries: list[TokenLogprob | None]) -> None:
        """The prompt logprobs of the choice of sequence ``key``, when its sampling asked."""

    def usage_chunk(self, completion_tokens: int) -> dict[str, Any]:
        return {**self.base, "choices": [], "usage": self.usage(completion_tokens)}

    # non-stream body
    def body(self, choices: list[Choice]) -> dict[str, Any]:
        raise NotImplementedError


class CompletionFormat(ResponseFormat):
    """``POST /v1/completions`` (``echo`` prepends each prompt's text to its choices)."""

    object_name = "text_completion"
    id_prefix = "cmpl"

    def __init__(
        self, server: ServingContext, req: CompletionRequest, plan: Plan, submitted: Submitted
    ) -> None:
        super().__init__(server, req, plan, submitted)
        self.echo = plan.echo or [""] * len(plan.prompts)
        keys = len(submitted.keys)
        self._logprobs = [CompletionLogprobs(server, len(self._prefix(i))) for i in range(keys)]
        self._started = [False] * keys
        self._prompt_logprobs: dict[str, list[TokenLogprob | None]] = {}  # by sequence key

    def _prefix(self, i: int) -> str:
        return self.echo[i // self.plan.n]

    def prompt_logprobs(self, key: str, entries: list[TokenLogprob | None]) -> None:
        """A choice's prompt logprobs (``echo`` with ``logprobs``: every choice scores its
        prompt, so each has them before its first token, streamed or not)."""
        self._prompt_logprobs[key] = entries

    def _echoed(self, i: int) -> list[Token]:
        """Choice ``i``'s prompt tokens with their logprobs, as the completion's own tokens
        (the first one has none), when ``echo`` asked for logprobs; else nothing."""
        entries = self._prompt_logprobs.get(self.submitted.keys[i])
        if entries is None:
            return []
        prompt = self.plan.prompts[i // self.plan.n]
        out = [Token("", prompt[0], "")]
        for e in entries[1:]:
            ids, values = list(e.top), list(e.top.values())
            out.append(Token("", e.token_id, "", None, e.logprob, ids, values))
        return out

    def usage(self, completion_tokens: int) -> dict[str, Any]:
        return super().usage(0 if self.plan.score_only else completion_tokens)

    def chunk(self, i: int, ev: Token) -> dict[str, Any] | None:
        text, echoed, own = ev.text, [], [ev]
        if self.plan.score_only:  # echo with max_tokens 0: the token drawn is not answered
            text, own, ev = "", [], dataclasses.replace(ev, finish_reason="length")
        if not self._started[i]:
            self._started[i] = True
            text = self._prefix(i) + text
            echoed = self._echoed(i)  # the prompt's tokens come first
        if not text and ev.finish_reason is None and ev.logprob is None:
            return None
        lp = None if self.req.logprobs is None else self._logprobs[i].build(echoed, own)
        return self._wrap(
            {"index": i, "text": text, "logprobs": lp, "finish_reason": ev.finish_reason}
        )

    def body(self, choices: list[Choice]) -> dict[str, Any]:
        out = []
        for i, c in enumerate(choices):
            prefix = self._prefix(i)
            own, text, finish = c.logprobs, prefix + "".join(c.text), c.finish
            if self.plan.score_only:  # echo with max_tokens 0: the token drawn is not answered
                own, text, finish = [], prefix, "length"
            lp = None
            if self.req.logprobs is not None:
                lp = CompletionLogprobs(self.server, len(prefix)).build(self._echoed(i), own)
            out.append({"index": i, "text": text, "logprobs": lp, "finish_reason": finish})
        completion_tokens = sum(c.tokens for c in choices)
        return {**self.base, "choices": out, "usage": self.usage(completion_tokens)}


class ChatFormat(ResponseFormat):
    """``POST /v1/chat/completions``: streams open with a role delta per choice and close
    each choice with an empty delta carrying its finish reason."""

    object_name = "chat.completion"
    id_prefix = "chatcmpl"

    def __init__(
        self, server: ServingContext, req: ChatCompletionRequest, plan: Plan, submitted: Submitted
    ) -> None:
        super().__init__(server, req, plan, submitted)
        if self.stream:
            self.base["object"] = "chat.completion.chunk"
        fmt = plan.tool_format
        keys = len(submitted.keys)
        self._tools = None if fmt is None else [ToolStreamParser(fmt) for _ in range(keys)]

    def opening(self) -> bytes:
        role = {"role": "assistant", "content": ""}
        return b"".join(
            sse(self._wrap({"index": i, "delta": role, "logprobs": None, "finish_reason": None}))
            for i in range(len(self.submitted.keys))
        )

    def chunk(self, i: int, ev: Token) -> dict[str, Any] | None:
        if self._tools is None:
            delta: dict[str, Any] = {"content": ev.text} if ev.text else {}
        else:
            delta = self._tool_delta(self._tools[i], ev)
        if not delta and ev.logprob is None:
            return None
        lp = None if ev.logprob is None else chat_logprobs(self.server, [ev])
        delta = delta or {"content": ""}
        return self._wrap({"index": i, "delta": delta, "logprobs": lp, "finish_reason": None})

    @staticmethod
    def _tool_delta(parser: ToolStreamParser, ev: Token) -> dict[str, Any]:
        """The content the parser releases for ``ev`` and the calls it completed."""
        before = len(parser.calls)
        text, calls = parser.feed(ev.text)
        if ev.finish_reason is not None:
            rest, more = parser.finish()
            text, calls = text + rest, calls + more
        delta: dict[str, Any] = {"content": text} if text else {}
        if calls:
            delta["tool_calls"] = [c.to_openai(before + j) for j, c in enumerate(calls)]
        return delta

    def finish_chunk(self, i: int, reason: str) -> dict[str, Any] | None:
        if self._tools is not None and self._tools[i].calls and reason == "stop":
            reason = "tool_calls"
        return self._wrap({"index": i, "delta": {}, "logprobs": None, "finish_reason": reason})

    def body(self, choices: list[Choice]) -> dict[str, Any]:
        out = []
        for i, c in enumerate(choices):
            lp = chat_logprobs(self.server, c.logprobs) if self.req.logprobs else None
            message: dict[str, Any] = {"role": "assistant", "content": "".join(c.text)}
            finish = c.finish
            if self.plan.tool_format is not None:
                parser = ToolStreamParser(self.plan.tool_format)
                text, _ = parser.feed(message["content"])
                rest, _ = parser.finish()
                if parser.calls:
                    message["content"] = (text + rest) or None
                    message["tool_calls"] = [call.to_openai() for call in parser.calls]
                    finish = "tool_calls" if finish == "stop" else finish
            out.append({"index": i, "message": message, "logprobs": lp, "finish_reason": finish})
        completion_tokens = sum(c.tokens for c in choices)
        return {**self.base, "choices": out, "usage": self.usage(completion_tokens)}
