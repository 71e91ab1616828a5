"""EventStream's event source: ends with the drain event, and always closes the user's
generator properly — on drain and when the stream is cancelled (client gone)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

import pytest

from app_toolkit._runtime import request_context
from app_toolkit.streaming import DRAIN_EVENT, _events

pytestmark = pytest.mark.anyio


class Source:
    """A generator that yields one event, then waits forever; records how it ended."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.ended: list[str] = []

    async def events(self) -> AsyncIterator[str]:
        try:
            yield "first"
            self.waiting.set()
            await asyncio.Event().wait()
            yield "never"
        except asyncio.CancelledError:
            self.ended.append("cancelled")
            raise
        finally:
            self.ended.append("closed")


async def test_drain_sends_the_final_event_and_closes_the_source() -> None:
    source, draining = Source(), asyncio.Event()
    token = request_context.draining.set(draining)
    try:
        stream = _events(source.events(), True, DRAIN_EVENT)
        first = await anext(stream)
        assert (first.data, first.id) == ("first", "1")
        pending = asyncio.ensure_future(anext(stream))
        await source.waiting.wait()
        draining.set()
        assert await asyncio.wait_for(pending, 5) is DRAIN_EVENT
        with pytest.raises(StopAsyncIteration):
            await anext(stream)
    finally:
        request_context.draining.reset(token)
    assert source.ended == ["cancelled", "closed"]


async def test_a_cancelled_stream_stops_the_source_it_was_waiting_on() -> None:
    tasks_before = asyncio.all_tasks()
    source, draining = Source(), asyncio.Event()
    token = request_context.draining.set(draining)
    try:
        stream = _events(source.events(), True, DRAIN_EVENT)
        assert isinstance(stream, AsyncGenerator)  # an async generator function's: it has aclose()
        await anext(stream)
        pending = asyncio.ensure_future(anext(stream))
        await source.waiting.wait()
        pending.cancel()  # the client left
        with pytest.raises(asyncio.CancelledError):
            await pending
        await stream.aclose()
    finally:
        request_context.draining.reset(token)
    assert source.ended == ["cancelled", "closed"]
    await asyncio.sleep(0)  # let cancelled helpers finish
    assert asyncio.all_tasks() == tasks_before
