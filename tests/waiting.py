"""Waiting for a state in tests: poll a condition until a deadline, never a fixed sleep."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar, overload

T = TypeVar("T")

#: A condition: a falsy answer (None or False among them) means "not yet".
Condition = Callable[[], T | None | Literal[False]]


def wait_for(
    condition: Condition[T], timeout_s: float = 30.0, what: str = "the condition", interval_s: float = 0.05
) -> T:
    """Call ``condition`` until it returns something truthy, and return that; fail the
    test, naming ``what``, once ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {value!r:.300})")
        time.sleep(interval_s)


@overload
async def wait_for_async(
    condition: Callable[[], Awaitable[T | None | Literal[False]]],
    timeout_s: float = ...,
    what: str = ...,
    interval_s: float = ...,
) -> T: ...


@overload
async def wait_for_async(
    condition: Condition[T], timeout_s: float = ..., what: str = ..., interval_s: float = ...
) -> T: ...


async def wait_for_async(
    condition: Callable[[], Any],
    timeout_s: float = 5.0,
    what: str = "the condition",
    interval_s: float = 0.005,
) -> Any:
    """:func:`wait_for` inside a running event loop (the loop keeps running meanwhile);
    ``condition`` may be a coroutine function, awaited each time."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(interval_s)
