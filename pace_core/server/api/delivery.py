"""A submission's events -> the HTTP answer, whole or streamed.

:func:`respond` waits on the
:class:`~pace_core.server.frontdoor.frontend.Submission`'s queue (with the
server's request timeout; a non-stream request also watches for the client going away) and
answers through a :mod:`~pace_core.server.api.openai_response` format: a JSON body, or an SSE
stream in which a late error becomes a ``data: {"error": ...}`` payload. Leaving early
(disconnect, timeout, error) cancels the request's unfinished sequences.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from pace_core.engine.events import Embedding, ErrorKind, SeqError, Token
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
        return StreamingResponse(
            _stream_body(server, fmt),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return fmt.body(await _collect(server, fmt, request))


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _events(
    server: ServingContext, sub: Submission, request: Request | None, watch_disconnect: bool
) -> AsyncIterator[Token | SeqError]:
    """The submission's events until all its sequences finished; cancels on exit.

    Each event costs one plain queue wait: the request's deadline (a timer) and the client
    going away (a watcher task, ``watch_disconnect``) put sentinels on the same queue, so no
    task or timer is made per event."""
    put = sub.queue.put_nowait
    timeout = server.config.request_timeout
    timer = None
    if timeout is not None:
        left = max(0.0, sub.created + timeout - time.monotonic())
        timer = asyncio.get_running_loop().call_later(left, put, _TIMED_OUT)
    disconnect = None
    if watch_disconnect:
        disconnect = asyncio.ensure_future(_wait_disconnect(request))
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
) -> AsyncIterator[Token | Embedding]:
    """A non-streamed submission's events; an engine error or the timeout raises its
    APIError."""
    try:
        async with contextlib.aclosing(_events(server, sub, request, True)) as events:
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
        choices[ev.key].add(ev)
    return [choices[k] for k in keys]


async def embeddings(
    server: ServingContext, request: Request, sub: Submission
) -> dict[str, Embedding]:
    """The vectors of an embedding submission by sequence key."""
    return {ev.key: ev async for ev in _answered(server, sub, request)}


async def _stream_body(server: ServingContext, fmt: ResponseFormat) -> AsyncIterator[bytes]:
    """The SSE body; errors become a ``data: {"error": ...}`` payload."""
    sub, keys = fmt.submitted.sub, fmt.submitted.keys
    opening = fmt.opening()
    if opening:
        yield opening
    index = {k: i for i, k in enumerate(keys)}
    completion_tokens = 0
    try:
        async with contextlib.aclosing(_events(server, sub, None, False)) as events:
            async for ev in events:
                if isinstance(ev, SeqError):
                    err = _engine_error(server, sub, ev)
                    server.metrics.errors.labels(err.instance, err.type).inc()
                    yield sse(err.body())
                    break
                completion_tokens += 1
                i = index[ev.key]
                chunk = fmt.chunk(i, ev)
                if chunk is not None:
                    yield sse(chunk)
                if ev.finish_reason is not None:
                    finish = fmt.finish_chunk(i, ev.finish_reason)
                    if finish is not None:
                        yield sse(finish)
            else:
                if fmt.include_usage:
                    yield sse(fmt.usage_chunk(completion_tokens))
    except _Timeout:
        err = _timeout_error(server)
        server.metrics.errors.labels("frontend", err.type).inc()
        yield sse(err.body())
    yield b"data: [DONE]\n\n"
