"""The benchmarks' load generator: one streamed request, its SSE payloads as they arrive.

The client shares the server's cores (one machine, a 2-core VM), so every microsecond it spends
per token is taken from the engine's threads and lands in the gaps and the throughput it
measures. An HTTP client library (httpx: an HTTP state machine, line decoders, a coroutine
hop per line) spends about twice the CPU per token of this: an asyncio protocol per request
that undoes the HTTP/1.1 framing (chunked, or a body until close) as bytes arrive and hands
each ``data:`` payload to a callback with its arrival time, on uvloop's event loop
(:func:`run`). ``pace bench one_user`` reports what it costs.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")
OnEvent = Callable[[str, float], None]
"""Called with each SSE ``data:`` payload (``[DONE]`` included) and its arrival time
(``time.perf_counter``)."""


class StreamError(RuntimeError):
    """The server answered with something other than an SSE stream, or broke off."""


class _SSEStream(asyncio.Protocol):
    """One request on its own connection: the answer's head, then its body's events."""

    def __init__(self, request: bytes, on_event: OnEvent, done: asyncio.Future[None]) -> None:
        self.request = request
        self.on_event = on_event
        self.done = done
        self.transport: Any = None
        self.buf = b""
        self.head: dict[bytes, bytes] | None = None
        self.status = b""
        self.events = b""  # body bytes not yet split into events

    def connection_made(self, transport: Any) -> None:  # asyncio's or uvloop's transport
        self.transport = transport  # both set TCP_NODELAY on their own
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.buf += data
        try:
            if self.head is None and not self._read_head():
                return
            self._read_body(now)
        except StreamError as exc:
            self._end(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done.done():
            return
        until_close = self.status.startswith(b"200") and self.head is not None
        if until_close and self.head.get(b"transfer-encoding") != b"chunked":
            self._events(self.buf, time.perf_counter(), final=True)  # the body ends here
            self._end(None)
        else:
            self._end(StreamError("the server closed the connection mid-stream"))

    def _end(self, error: StreamError | None) -> None:
        if not self.done.done():
            if error is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(error)
        if self.transport is not None:
            self.transport.close()

    def _read_head(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        lines = self.buf[:end].split(b"\r\n")
        head = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            head[name.strip().lower()] = value.strip().lower()
        self.status = b" ".join(lines[0].split(b" ", 2)[1:])
        self.head, self.buf = head, self.buf[end + 4 :]
        return True

    def _read_body(self, now: float) -> None:
        head = self.head or {}
        if not self.status.startswith(b"200"):
            length = int(head.get(b"content-length", b"0"))
            if len(self.buf) >= length:
                answer = self.buf[:length][:300]
                raise StreamError(f"status {self.status.decode()}: {answer!r}")
            return
        if head.get(b"transfer-encoding") != b"chunked":
            self.buf = self._events(self.buf, now)
            return
        while (eol := self.buf.find(b"\r\n")) >= 0:
            size = int(self.buf[:eol].split(b";")[0], 16)
            if len(self.buf) < eol + 2 + size + 2:
                return  # the chunk is not whole yet
            chunk, self.buf = self.buf[eol + 2 : eol + 2 + size], self.buf[eol + 4 + size :]
            if size == 0:
                self._end(None)
                return
            self.events = self._events(self.events + chunk, now)

    def _events(self, data: bytes, now: float, final: bool = False) -> bytes:
        """Hand over the whole events in ``data``; returns the unfinished rest."""
        *events, rest = data.split(b"\n\n")
        if final and rest.strip():
            events.append(rest)
        for event in events:
            if event.startswith(b"data: "):
                self.on_event(event[6:].decode(), now)
        return rest


async def stream_events(
    url: str, path: str, body: dict[str, Any], on_event: OnEvent, timeout: float = 600.0
) -> None:
    """POST ``body`` as JSON to ``url + path`` on a new connection and call ``on_event`` for
    each SSE payload until the stream ends; raises :class:`StreamError` for a non-200 answer
    or a broken stream, ``TimeoutError`` after ``timeout`` s."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    data = json.dumps(body).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    try:
        transport, _ = await asyncio.wait_for(
            loop.create_connection(lambda: _SSEStream(request, on_event, done), host, port),
            timeout,
        )
    except OSError as exc:
        raise StreamError(f"cannot connect to {host}:{port}: {exc}") from exc
    try:
        await asyncio.wait_for(done, timeout)
    finally:
        transport.close()


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run the load generator ``main`` to completion on uvloop's event loop where it is
    installed (less CPU per event than asyncio's own, taken from the server it measures),
    else on asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
