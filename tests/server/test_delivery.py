"""delivery._events: a submission's events in order, its deadline and disconnect as sentinels."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from pace_core.engine.events import Token
from pace_core.server.api import delivery
from pace_core.server.frontdoor.frontend import Submission


def _server(timeout: float | None) -> SimpleNamespace:
    cancelled: list[Submission] = []
    return SimpleNamespace(
        config=SimpleNamespace(request_timeout=timeout),
        frontend=SimpleNamespace(cancel=cancelled.append),
        cancelled=cancelled,
    )


def _submission(*keys: str) -> Submission:
    return Submission(list(keys), 0, time.monotonic(), remaining=set(keys))


def _finish(sub: Submission, key: str, text: str, reason: str | None) -> None:
    """What the frontend does with an engine's token: mark a finished sequence, queue it."""
    if reason is not None:
        sub.remaining.discard(key)
    sub.queue.put_nowait(Token(key, 1, text, reason))


async def _collect(server, sub: Submission, request=None, watch=False) -> list[str]:
    return [ev.text async for ev in delivery._events(server, sub, request, watch)]


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
            async for ev in delivery._events(server, sub, None, False):
                got.append(ev.text)
        return got, server.cancelled

    got, cancelled = asyncio.run(go())
    assert got == ["0"] and len(cancelled) == 1


def test_a_disconnect_ends_a_watched_request_and_cancels_it():
    class Request:
        async def receive(self):
            await asyncio.sleep(0.02)
            return {"type": "http.disconnect"}

    async def go():
        server, sub = _server(None), _submission("a", "b")
        _finish(sub, "a", "0", "stop")
        return await _collect(server, sub, Request(), True), server.cancelled

    texts, cancelled = asyncio.run(go())
    assert texts == ["0"] and len(cancelled) == 1
