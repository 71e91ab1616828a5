"""Streaming handle calls of sync generators: each item made in a thread, and the
generator closed properly when the caller goes away mid-item."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Generator

import pytest

from app_toolkit._runtime.replica.user_code import iterate_in_thread

pytestmark = pytest.mark.anyio


async def test_items_come_in_order_and_the_generator_closes() -> None:
    closed = threading.Event()

    def numbers() -> Generator[int, None, None]:
        try:
            yield from range(3)
        finally:
            closed.set()

    assert [item async for item in iterate_in_thread(numbers())] == [0, 1, 2]
    assert closed.is_set()


async def test_a_caller_leaving_mid_item_closes_the_generator_once_its_thread_is_out() -> None:
    inside, closed = threading.Event(), threading.Event()

    def slow() -> Generator[int, None, None]:
        try:
            yield 1
            inside.set()
            time.sleep(0.2)  # a thread is inside the generator when the caller leaves
            yield 2
        finally:
            closed.set()

    async def consume() -> None:
        async for _ in iterate_in_thread(slow()):
            pass

    task = asyncio.ensure_future(consume())
    assert await asyncio.to_thread(inside.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):  # not "generator already executing"
        await task
    assert await asyncio.to_thread(closed.wait, 5)  # its finally ran
