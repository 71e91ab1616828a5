"""A loop that waits on an event with a deadline stops when cancelled, even when the
event is set in the same turn (asyncio.wait_for on Python 3.11 would swallow that)."""

from __future__ import annotations

import asyncio

import pytest

from app_toolkit._runtime.waiting import wait_event

pytestmark = pytest.mark.anyio


async def test_wait_event_reports_set_or_timed_out() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, 0.01) is True


async def test_cancellation_is_kept_when_the_event_fires_in_the_same_turn() -> None:
    async def loop(event: asyncio.Event) -> None:
        while True:
            await wait_event(event, 10)
            event.clear()

    for _ in range(50):
        event = asyncio.Event()
        task = asyncio.ensure_future(loop(event))
        await asyncio.sleep(0)  # the loop now waits on the event
        event.set()
        task.cancel()  # in the same turn as the event: a race wait_for loses
        done, _ = await asyncio.wait({task}, timeout=1)
        assert task in done and task.cancelled()
