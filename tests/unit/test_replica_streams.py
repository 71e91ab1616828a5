"""Streaming handle calls of sync generators: each item made in a thread, and the
generator closed properly when the caller goes away mid-item."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Coroutine, Generator
from concurrent.futures import ThreadPoolExecutor

import pytest

from app_toolkit._runtime.replica.user_code import call_maybe_async, iterate_in_thread

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


async def test_a_coroutine_returned_after_its_caller_left_is_closed() -> None:
    """A sync method run in a thread whose caller is cancelled (a hook past its bound)
    still returns later; the coroutine it returns is closed, not left to warn that it
    was never awaited (that warning failed a CI run)."""
    entered, release = threading.Event(), threading.Event()
    started: list[bool] = []

    async def answer() -> int:
        started.append(True)
        return 1

    made: list[Coroutine[object, object, int]] = []

    def blocks_then_returns_a_coroutine() -> Coroutine[object, object, int]:
        entered.set()
        release.wait(5)
        made.append(answer())
        return made[0]

    call = asyncio.ensure_future(call_maybe_async(blocks_then_returns_a_coroutine))
    for _ in range(500):  # until a thread runs it (one not begun never would)
        if entered.is_set():
            break
        await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    release.set()
    for _ in range(200):
        await asyncio.sleep(0.01)
        if made and inspect.getcoroutinestate(made[0]) == inspect.CORO_CLOSED:
            break
    # Closed before it ran:
    assert made and inspect.getcoroutinestate(made[0]) == inspect.CORO_CLOSED and not started


async def test_a_sync_call_cancelled_before_a_thread_took_it_never_runs() -> None:
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
    release = threading.Event()
    ran: list[int] = []
    busy = asyncio.ensure_future(call_maybe_async(release.wait, 5))
    queued = asyncio.ensure_future(call_maybe_async(ran.append, 1))
    await asyncio.sleep(0.05)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    release.set()
    assert await busy is True
    await call_maybe_async(ran.append, 2)  # after the cancelled one in the one thread's line
    assert ran == [2]
