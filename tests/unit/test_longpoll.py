from __future__ import annotations

import asyncio
import pickle

import pytest

from app_toolkit._runtime.controller.longpoll import LongPollHost
from app_toolkit._runtime.messages import DeploymentID, RouteInfo
from app_toolkit._runtime.tables import ApplicationTable, Update

pytestmark = pytest.mark.anyio

A = ApplicationTable(())
B = ApplicationTable((RouteInfo("/b", "b", DeploymentID("b", "D")),))


async def test_listen_returns_new_values_and_waits_for_changes() -> None:
    host = LongPollHost(first_version=0)
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


async def test_a_woken_call_looks_at_the_keys_published_since_it_last_looked() -> None:
    host = LongPollHost(log_size=3, first_version=0)
    for key in "abc":
        host.publish(key, A)
    known = {"a": 1, "b": 1, "c": 1}
    start = host.generation
    host.publish("d", A)  # a key nobody here follows
    assert host.published_since(start) == {"d"}
    assert host.published_since(host.generation) == set()
    waiter = asyncio.ensure_future(host.listen(known, 5))
    await asyncio.sleep(0.01)
    host.publish("e", A)
    await asyncio.sleep(0.01)
    assert not waiter.done()  # woken, found nothing of its own, waits again
    host.publish("b", B)
    assert await waiter == {"b": Update(2, B)}
    # The log holds the last 3 publishes; a call that slept through more looks at every key.
    assert host.published_since(start) == {"d", "e", "b"}
    host.publish("f", A)
    assert host.published_since(start) is None
    host.publish("a", B)
    host.publish("c", B)
    assert host.published_since(host.generation - 3) == {"f", "a", "c"}


async def test_a_call_that_sleeps_through_more_publishes_than_the_log_holds_misses_nothing() -> None:
    host = LongPollHost(log_size=2, first_version=0)
    host.publish("mine", A)
    waiter = asyncio.ensure_future(host.listen({"mine": 1}, 5))
    await asyncio.sleep(0.01)
    # All in one go, before the waiter runs again: its change falls out of the log.
    host.publish("mine", B)
    for n in range(5):
        host.publish(f"other-{n}", A)
    assert await waiter == {"mine": Update(2, B)}


async def test_a_published_update_is_pickled_once_and_unpickles_equal() -> None:
    host = LongPollHost(first_version=0)
    host.publish("k", B)
    first = (await host.listen({"k": -1}, 1))["k"]
    second = (await host.listen({"k": 0}, 1))["k"]
    assert first is second and first.packed_form  # one object, packed at publish
    data = pickle.dumps(first)
    assert first.packed_form in data  # the packed bytes are sent as they are
    back = pickle.loads(data)
    assert back == Update(1, B) and back.packed_form == b""
    never = (await host.listen({"unknown": -1}, 1))["unknown"]
    assert pickle.loads(pickle.dumps(never)) == Update(0, None)


async def test_a_restarted_hosts_versions_are_larger_than_its_predecessors() -> None:
    before = LongPollHost()
    for index in range(100):
        before.publish("k", ApplicationTable((RouteInfo(f"/{index}", "a", DeploymentID("a", "D")),)))
    await asyncio.sleep(0.002)  # a restart takes longer than a microsecond per publish
    after = LongPollHost()  # the controller restarted
    after.publish("k", A)
    assert after.version("k") > before.version("k") > 0
    assert after.version("never") == 0
