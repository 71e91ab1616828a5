from __future__ import annotations

import asyncio

import pytest

from app_toolkit._runtime.controller.longpoll import LongPollHost
from app_toolkit._runtime.messages import DeploymentID, RouteInfo
from app_toolkit._runtime.tables import ApplicationTable, Update

pytestmark = pytest.mark.anyio

A = ApplicationTable(())
B = ApplicationTable((RouteInfo("/b", "b", DeploymentID("b", "D")),))


async def test_listen_returns_new_values_and_waits_for_changes() -> None:
    host = LongPollHost()
    assert await host.listen({"k": -1}, 1) == {"k": Update(0, None)}
    host.publish("k", A)
    assert await host.listen({"k": 0}, 1) == {"k": Update(1, A)}
    waiter = asyncio.ensure_future(host.listen({"k": 1}, 5))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    host.publish("k", ApplicationTable(()))  # an equal value: no new version
    await asyncio.sleep(0.01)
    assert not waiter.done()
    host.publish("k", B)
    assert await waiter == {"k": Update(2, B)}
    assert await host.listen({"k": 2}, 0.01) == {}
