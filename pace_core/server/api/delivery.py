"""A submission's events -> the HTTP answer, whole or streamed.

:func:`respond` waits on the
:class:`~pace_core.server.frontdoor.frontend.Submission`'s queue (with the server's request
timeout, watching for the client going away) and answers through a
:mod:`~pace_core.server.api.openai_response` format: a JSON body, or an SSE stream
(:class:`EventStreamResponse`) in which a late error becomes a ``data: {"error": ...}``
payload. Leaving early (disconnect, timeout, error) cancels the request's unfinished
sequences.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from pace_core.engine.events import Embedding, ErrorKind, PromptLogprobs, SeqError, Token
from pace_core.server.api.openai_response import Choice, ResponseFormat, sse
from pace_core.server.api.protocol import APIError
from pace_core.server.frontdoor.context import ServingContext
from pace_core.server.frontdoor.frontend import Submission


class _Timeout(Exception):
    pass


_TIMED_OUT = object()  # put on a submission's queue when its request timeout is up
_GONE = object()  # put on it when the client disconnected (non-stream requests watch)


async def respond(server: ServingContext, request: Request, fmt: ResponseFormat) -> Any:
    """The answer to a submitted request: a streaming response or the whole body."""
    if fmt.stream:
        return EventStreamResponse(server, fmt)
    return fmt.body(await _collect(server, fmt, request))


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _events(
    server: ServingContext, sub: Submission, receive: Receive | None
) -> AsyncIterator[Token | PromptLogprobs | SeqError]:
    """The submission's events until all its sequences finished; cancels on exit.

    Each event costs one plain queue wait: the request's deadline (a timer) and the client
    going away (a watcher task on ``receive``, when given) put sentinels on the same queue,
    so no task or timer is made per event."""
    put = sub.queue.put_nowait
    timeout = server.config.request_timeout
    timer = None
    if timeout is not None:
        left = max(0.0, sub.created + timeout - time.monotonic())
        timer = asyncio.get_running_loop().call_later(left, put, _TIMED_OUT)
    disconnect = None
    if receive is not None:
        disconnect = asyncio.ensure_future(_wait_disconnect(receive))
        disconnect.add_done_callback(lambda task: task.cancelled() or put(_GONE))
    try:
        while not (sub.done and sub.queue.empty()):
            ev = await sub.queue.get()
            if ev is _TIMED_OUT or ev is _GONE:
                if sub.done:
                    continue  # every event came first: nothing was lost
                if ev is _GONE:
                    return
                raise _Timeout()
            yield ev
    finally:
        if timer is not None:
            timer.cancel()
        if disconnect is not None:
            disconnect.cancel()
        if not sub.done:
            server.frontend.cancel(sub)


def _timeout_error(server: ServingContext) -> APIError:
    return APIError(
        408,
        f"the request did not finish within the server's request timeout "
        f"({server.config.request_timeout} s)",
        "timeout_error",
        code="request_timeout",
    )


# what each engine error kind is to an OpenAI client: (HTTP status, error type)
_HTTP_ERRORS: dict[ErrorKind, tuple[int, str]] = {
    ErrorKind.INVALID_REQUEST: (400, "invalid_request_error"),
    ErrorKind.UNAVAILABLE: (503, "unavailable"),
    ErrorKind.ENGINE_ERROR: (503, "engine_error"),
}


def _engine_error(server: ServingContext, sub: Submission, ev: SeqError) -> APIError:
    status, error_type = _HTTP_ERRORS[ev.kind]
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    instance = server.frontend.instances[sub.instance].name
    return APIError(status, ev.message, error_type, headers=headers, instance=instance)


async def _answered(
    server: ServingContext, sub: Submission, request: Request
) -> AsyncIterator[Token | PromptLogprobs | Embedding]:
    """A non-streamed submission's events; an engine error or the timeout raises its
    APIError."""
    try:
        async with contextlib.aclosing(_events(server, sub, request.receive)) as events:
            async for ev in events:
                if isinstance(ev, SeqError):
                    raise _engine_error(server, sub, ev)
                yield ev
    except _Timeout:
        raise _timeout_error(server) from None


async def _collect(server: ServingContext, fmt: ResponseFormat, request: Request) -> list[Choice]:
    sub, keys = fmt.submitted.sub, fmt.submitted.keys
    choices = {k: Choice() for k in keys}
    async for ev in _answered(server, sub, request):
        if isinstance(ev, PromptLogprobs):
            fmt.prompt_logprobs(ev.key, ev.entries)
        else:
            choices[ev.key].add(ev)
    return [choices[k] for k in keys]


async def embeddings(
    server: ServingContext, request: Request, sub: Submission
) -> dict[str, Embedding] | None:
    """The vectors of an embedding submission by sequence key; None when the client went
    away before all of them came (nobody to answer)."""
    found = {ev.key: ev async for ev in _answered(server, sub, request)}
    return found if len(found) == len(sub.keys) else None


_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class EventStreamResponse(Response):
    """A streamed answer: the format's SSE chunks written to the connection as the
    submission's events arrive.

    One ``send`` per wake-up carries every event that arrived with it (the tokens of a
    speculative step, a finish chunk) and nothing runs per token but the queue wait, the
    chunk and the write: no task per response body (Starlette's ``StreamingResponse``
    keeps one beside the body to hear a disconnect; here the events' own watcher does).
    """

    media_type = "text/event-stream"

    def __init__(self, server: ServingContext, fmt: ResponseFormat) -> None:
        self.server = server
        self.fmt = fmt
        self.status_code = 200
        self.background = None
        self.init_headers(_SSE_HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await _write_stream(self.server, self.fmt, receive, send)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away (ASGI 2.4 servers raise on send)
            sub = self.fmt.submitted.sub
            if not sub.done:
                self.server.frontend.cancel(sub)


async def _write_stream(
    server: ServingContext, fmt: ResponseFormat, receive: Receive, send: Send
) -> None:
    """The SSE body: a chunk per token, a finish chunk per choice, ``usage`` when asked for
    and ``[DONE]``; an engine error or the timeout becomes a ``data: {"error": ...}``
    payload."""
    sub, keys = fmt.submitted.sub, fmt.submitted.keys
    pieces: list[bytes] = []

    def write() -> Awaitable[None]:
        body = b"".join(pieces)
        pieces.clear()
        return send({"type": "http.response.body", "body": body, "more_body": True})

    opening = fmt.opening()
    if opening:
        pieces.append(opening)
        await write()
    index = {k: i for i, k in enumerate(keys)}
    completion_tokens = 0
    try:
        async with contextlib.aclosing(_events(server, sub, receive)) as events:
            async for ev in events:
                if isinstance(ev, SeqError):
                    err = _engine_error(server, sub, ev)
                    server.metrics.errors.labels(err.instance, err.type).inc()
                    pieces.append(sse(err.body()))
                    break
                if isinstance(ev, PromptLogprobs):  # before the choice's first token
                    fmt.prompt_logprobs(ev.key, ev.entries)
                    continue
                completion_tokens += 1
                i = index[ev.key]
                chunk = fmt.chunk(i, ev)
                if chunk is not None:
                    pieces.append(sse(chunk))
                if ev.finish_reason is not None:
                    finish = fmt.finish_chunk(i, ev.finish_reason)
                    if finish is not None:
                        pieces.append(sse(finish))
                if pieces and sub.queue.empty():  # what this wake-up brought, in one write
                    await write()
            else:
                if fmt.include_usage:
                    pieces.append(sse(fmt.usage_chunk(completion_tokens)))
    except _Timeout:
        err = _timeout_error(server)
        server.metrics.errors.labels("frontend", err.type).inc()
        pieces.append(sse(err.body()))
    pieces.append(b"data: [DONE]\n\n")
    await write()
