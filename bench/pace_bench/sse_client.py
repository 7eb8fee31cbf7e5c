"""A lean blocking client for one streamed request: the SSE payloads as they arrive.

Where the client shares the server's cores (one machine, a 2-core VM), every microsecond it
spends per token is taken from the engine's threads and lands in the gaps it measures. An
asyncio client (httpx: an event loop, an HTTP state machine, line decoders) spends about twice
the CPU per token of this reader -- one socket, one ``recv`` per chunk, HTTP/1.1 chunked
framing undone by hand (``pace bench one_user`` reports its cost). It speaks just what a
streamed completion needs: one POST, a 200 with ``Transfer-Encoding: chunked``, ``data:``
events.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit


class StreamError(RuntimeError):
    """The server answered with something other than an SSE stream, or broke off."""


class _Connection:
    """A socket read through a buffer: whole lines and exact byte counts."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _more(self) -> None:
        got = self.sock.recv(65536)
        if not got:
            raise StreamError("the server closed the connection mid-stream")
        self.buf += got

    def line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            self._more()
        line, self.buf = self.buf[:end], self.buf[end + 2 :]
        return line

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def stream_events(
    url: str, path: str, body: dict[str, Any], timeout: float = 600.0
) -> Iterator[str]:
    """POST ``body`` as JSON to ``url + path`` and yield each SSE ``data:`` payload (``[DONE]``
    included) as it arrives; raises :class:`StreamError` for a non-200 answer."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(head.encode() + data)
        conn = _Connection(sock)
        status = conn.line().split(b" ", 2)
        headers = {}
        while line := conn.line():
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        if len(status) < 2 or status[1] != b"200":
            length = int(headers.get(b"content-length", b"0"))
            raise StreamError(
                f"status {b' '.join(status[1:]).decode()}: {conn.exactly(length)[:300]!r}"
            )
        if headers.get(b"transfer-encoding") != b"chunked":
            raise StreamError("the answer is not a chunked stream")
        pending = b""
        while size := int(conn.line().split(b";")[0], 16):
            pending += conn.exactly(size)
            conn.exactly(2)  # the chunk's CRLF
            *events, pending = pending.split(b"\n\n")
            for event in events:
                if event.startswith(b"data: "):
                    yield event[6:].decode()
