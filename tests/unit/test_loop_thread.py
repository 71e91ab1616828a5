"""LoopThread: an event loop in a daemon thread, stopped bounded and owned."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from app_toolkit._runtime.loop_thread import LoopThread
from tests.waiting import wait_for


def test_calls_see_the_running_loop_and_stop_ends_tasks_executor_and_thread() -> None:
    thread = LoopThread("test-loop")
    release = threading.Event()

    workers: list[threading.Thread] = []

    def in_worker() -> None:
        workers.append(threading.current_thread())
        release.wait(5)

    def start() -> asyncio.Task[bool]:
        loop = asyncio.get_running_loop()  # a plain function called on the loop sees it
        loop.create_task(asyncio.to_thread(in_worker))
        return loop.create_task(asyncio.Event().wait())

    task = thread.call(start).result(timeout=5)
    wait_for(lambda: workers, 5, "the worker thread to start")
    release.set()
    thread.stop(timeout_s=5)
    assert thread.done()
    assert task.cancelled()  # cancelled and awaited
    assert thread.loop.is_closed()
    assert not workers[0].is_alive()  # the default executor was shut down
    with pytest.raises(RuntimeError):  # closed: the call fails, never hangs
        thread.call(lambda: 1).result(timeout=5)


def test_a_task_that_swallows_cancellation_is_logged_and_stop_is_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    thread = LoopThread("test-stubborn")
    done = threading.Event()

    async def stubborn() -> None:
        while not done.is_set():
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                pass  # ignores it: stop must not wait for it forever

    thread.call(lambda: asyncio.get_running_loop().create_task(stubborn(), name="stubborn")).result(timeout=5)
    with caplog.at_level(logging.WARNING, "app_toolkit.loop_thread"):
        thread.stop(timeout_s=0.2)
    assert "Task stubborn on test-stubborn did not end within 0.2 s of being cancelled" in caplog.text
    assert thread.done()
    done.set()
