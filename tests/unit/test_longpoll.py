from __future__ import annotations

import asyncio

import pytest

from app_toolkit._runtime.longpoll import LongPollHost

pytestmark = pytest.mark.anyio


async def test_listen_returns_new_values_and_waits_for_changes() -> None:
    host = LongPollHost()
    assert await host.listen({"k": -1}, 1) == {"k": (0, None)}
    host.publish("k", "a")
    assert await host.listen({"k": 0}, 1) == {"k": (1, "a")}
    waiter = asyncio.ensure_future(host.listen({"k": 1}, 5))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    host.publish("k", "a")  # same value: no new version
    await asyncio.sleep(0.01)
    assert not waiter.done()
    host.publish("k", "b")
    assert await waiter == {"k": (2, "b")}
    assert await host.listen({"k": 2}, 0.01) == {}
