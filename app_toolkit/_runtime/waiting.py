"""Waiting for an event with a deadline, in the loops that run until cancelled.

``asyncio.wait_for`` on Python 3.11 loses a cancellation that arrives as the awaited
event is set (it returns the result instead), so a loop built on it can outlive the owner
that cancelled it and wait for it. ``asyncio.timeout`` keeps the cancellation.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout_s: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` passes; returns whether it is set."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
