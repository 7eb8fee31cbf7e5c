"""pace_bench.sse_client: SSE payloads out of an HTTP/1.1 answer (chunked, or a body until
close), each with its arrival time; errors named."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest
from pace_bench.sse_client import StreamError, stream_events


def _serve_once(answer: bytes) -> tuple[str, list[bytes]]:
    """A server on a free port that reads one request and writes ``answer``; returns its
    URL and the list its request lands in."""
    listener = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def run() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, body = data.split(b"\r\n\r\n", 1)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += conn.recv(65536)
            got.append(head + b"\r\n\r\n" + body)
            conn.sendall(answer)

    threading.Thread(target=run, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", got


def _events(url: str, body: dict | None = None) -> list[str]:
    got: list[tuple[str, float]] = []

    def on_event(payload: str, now: float) -> None:
        got.append((payload, now))

    asyncio.run(stream_events(url, "/v1/completions", body or {}, on_event, timeout=10))
    assert [t for _, t in got] == sorted(t for _, t in got)
    return [p for p, _ in got]


def _chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def test_events_split_across_chunks_and_joined_in_one_come_out_whole():
    stream = _chunked(b'data: {"a":1}\n\ndata: {"b"', b":2}\n\n", b"data: [DONE]\n\n")
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    answer += b"Transfer-Encoding: chunked\r\n\r\n" + stream
    url, got = _serve_once(answer)
    assert _events(url, {"prompt": "hi"}) == ['{"a":1}', '{"b":2}', "[DONE]"]
    assert got[0].startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert got[0].endswith(b'{"prompt": "hi"}')


def test_an_error_status_is_raised_with_its_body():
    body = b'{"error":{"message":"bad"}}'
    answer = b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    url, _ = _serve_once(answer)
    with pytest.raises(StreamError, match="status 400 Bad Request.*bad"):
        _events(url)


def test_a_stream_cut_short_is_an_error():
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"5\r\ndata:"
    url, _ = _serve_once(answer)
    with pytest.raises(StreamError, match="closed the connection"):
        _events(url)


def test_a_body_until_close_is_a_stream_too():
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    answer += b'data: {"a":1}\n\ndata: [DONE]\n\n'
    url, _ = _serve_once(answer)
    assert _events(url) == ['{"a":1}', "[DONE]"]
