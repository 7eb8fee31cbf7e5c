"""delivery._events: a submission's events in order, its deadline and disconnect as sentinels."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from pace_core.engine.events import Token
from pace_core.server.api import delivery
from pace_core.server.api.openai_response import sse
from pace_core.server.frontdoor.frontend import Submission


def _server(timeout: float | None) -> SimpleNamespace:
    cancelled: list[Submission] = []

    def cancel(sub: Submission) -> None:  # as the frontend: the sequences stop, it is done
        cancelled.append(sub)
        sub.remaining.clear()

    return SimpleNamespace(
        config=SimpleNamespace(request_timeout=timeout),
        frontend=SimpleNamespace(cancel=cancel),
        cancelled=cancelled,
    )


def _submission(*keys: str) -> Submission:
    return Submission(list(keys), 0, time.monotonic(), remaining=set(keys))


def _finish(sub: Submission, key: str, text: str, reason: str | None) -> None:
    """What the frontend does with an engine's token: mark a finished sequence, queue it."""
    if reason is not None:
        sub.remaining.discard(key)
    sub.queue.put_nowait(Token(key, 1, text, reason))


async def _collect(server, sub: Submission, receive=None) -> list[str]:
    return [ev.text async for ev in delivery._events(server, sub, receive)]


def test_events_arrive_in_order_and_a_late_deadline_loses_none():
    async def go():
        server, sub = _server(0.05), _submission("a")
        for i in range(5):
            _finish(sub, "a", str(i), None)
        _finish(sub, "a", "5", "length")
        sub.queue.put_nowait(delivery._TIMED_OUT)  # the deadline came after the last token
        texts = await _collect(server, sub)
        await asyncio.sleep(0.1)  # the timer was cancelled: nothing more lands on the queue
        return texts, sub.queue.qsize(), server.cancelled

    texts, left, cancelled = asyncio.run(go())
    assert texts == ["0", "1", "2", "3", "4", "5"]
    assert left == 0 and cancelled == []


def test_the_deadline_ends_an_unfinished_request_and_cancels_it():
    async def go():
        server, sub = _server(0.05), _submission("a")
        _finish(sub, "a", "0", None)
        got: list[str] = []
        with pytest.raises(delivery._Timeout):
            async for ev in delivery._events(server, sub, None):
                got.append(ev.text)
        return got, server.cancelled

    got, cancelled = asyncio.run(go())
    assert got == ["0"] and len(cancelled) == 1


def test_a_disconnect_ends_a_watched_request_and_cancels_it():
    async def receive():
        await asyncio.sleep(0.02)
        return {"type": "http.disconnect"}

    async def go():
        server, sub = _server(None), _submission("a", "b")
        _finish(sub, "a", "0", "stop")
        return await _collect(server, sub, receive), server.cancelled

    texts, cancelled = asyncio.run(go())
    assert texts == ["0"] and len(cancelled) == 1


class _TextFormat:
    """The stream pieces of a response format, reduced to the token text."""

    include_usage = False

    def __init__(self, sub: Submission) -> None:
        self.submitted = SimpleNamespace(sub=sub, keys=sub.keys)

    def opening(self) -> bytes:
        return b""

    def chunk(self, i: int, ev: Token) -> dict:
        return {"text": ev.text}

    def finish_chunk(self, i: int, reason: str) -> dict:
        return {"finish": reason}


def test_a_stream_writes_what_each_wake_up_brought_in_one_send():
    async def go():
        server, sub = _server(None), _submission("a")
        for i in range(3):  # three tokens arrive together (a speculative step)
            _finish(sub, "a", str(i), None)
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        async def receive() -> dict:
            await asyncio.Event().wait()  # the client stays
            return {}

        response = delivery.EventStreamResponse(server, _TextFormat(sub))
        answer = asyncio.ensure_future(response({"type": "http"}, receive, send))
        await asyncio.sleep(0.02)
        _finish(sub, "a", "3", "length")
        await answer
        return sent

    sent = asyncio.run(go())
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert dict(sent[0]["headers"])[b"content-type"].startswith(b"text/event-stream")
    bodies = [m["body"] for m in sent[1:]]
    assert bodies == [
        sse({"text": "0"}) + sse({"text": "1"}) + sse({"text": "2"}),
        sse({"text": "3"}) + sse({"finish": "length"}),
        b"data: [DONE]\n\n",
        b"",
    ]
    assert [m["more_body"] for m in sent[1:]] == [True, True, True, False]


def test_a_stream_whose_client_is_gone_cancels_its_request():
    async def go():
        server, sub = _server(None), _submission("a")
        _finish(sub, "a", "0", None)

        async def send(message: dict) -> None:
            if message["type"] == "http.response.body":
                raise OSError("connection reset")  # an ASGI 2.4 server, client gone

        async def receive() -> dict:
            await asyncio.Event().wait()
            return {}

        await delivery.EventStreamResponse(server, _TextFormat(sub))({}, receive, send)
        return server.cancelled

    assert len(asyncio.run(go())) == 1
