"""A caller's table subscriber: stored tables until the controller answers, and a
controller that never answers counts as unreachable."""

from __future__ import annotations

import asyncio

import pytest

from app_toolkit._runtime.messages import DeploymentID, ReplicaInfo, RouteInfo
from app_toolkit._runtime.routing import subscriber as subscriber_module
from app_toolkit._runtime.routing.subscriber import TableSubscriber
from app_toolkit._runtime.tables import (
    APPLICATIONS_KEY,
    ApplicationTable,
    ReplicaTable,
    Table,
    Update,
    Updates,
    Versions,
    replicas_key,
)
from app_toolkit.exceptions import RequestLostError
from tests.waiting import wait_for_async

pytestmark = pytest.mark.anyio

DEPLOYMENT = DeploymentID("app", "Ingress")
STORED_ROUTES = ApplicationTable((RouteInfo("/stored", "app", DEPLOYMENT),))
LIVE_ROUTES = ApplicationTable((RouteInfo("/live", "app", DEPLOYMENT),))
STORED_REPLICAS = ReplicaTable((ReplicaInfo("r1", DEPLOYMENT, "127.0.0.1", 1, b"t", 5),), 100)


class Controller:
    """A controller that is down (calls wait) until ``answer`` is set."""

    def __init__(self) -> None:
        self.up = asyncio.Event()
        self.calls = 0
        self.tables: dict[str, Table] = {APPLICATIONS_KEY: LIVE_ROUTES}

    async def listen(self, known: Versions, timeout_s: float) -> Updates:
        self.calls += 1
        await self.up.wait()
        updates = {key: Update(1, self.tables.get(key)) for key, version in known.items() if version != 1}
        if not updates:
            await asyncio.sleep(timeout_s)  # a real long poll: nothing new, wait
        return updates


def _connect(info: ReplicaInfo) -> object:
    raise AssertionError("no request is sent in this test")


async def test_stored_tables_serve_until_the_controller_answers() -> None:
    controller = Controller()
    subscriber = TableSubscriber(controller.listen, _connect, lost_error=RequestLostError)  # type: ignore[arg-type]
    subscriber.seed(
        {
            APPLICATIONS_KEY: STORED_ROUTES,
            replicas_key(DEPLOYMENT): STORED_REPLICAS,
            "other": STORED_ROUTES,
        }
    )
    seen: list[Table | None] = []
    ready = subscriber.watch(APPLICATIONS_KEY, seen.append)
    # Served at once, while the controller does not answer.
    assert ready.is_set() and seen == [STORED_ROUTES]
    dispatcher = subscriber.dispatcher(DEPLOYMENT)
    assert dispatcher.max_queued_requests == 100  # the stored replica table, applied
    controller.up.set()
    await wait_for_async(lambda: seen[-1] == LIVE_ROUTES, what="the controller's table")
    # Once the controller has answered, stored tables are out of date: a key watched
    # from now on gets the controller's answer (here: never published), not the stored one.
    late: list[Table | None] = []
    subscriber.watch("other", late.append)
    await wait_for_async(lambda: late == [None], what="the controller's answer for a key it never published")
    subscriber.close()


async def test_a_controller_that_never_answers_is_polled_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subscriber_module, "LONG_POLL_TIMEOUT_S", 0.05)
    monkeypatch.setattr(subscriber_module, "_LISTEN_GRACE_S", 0.05)
    monkeypatch.setattr(subscriber_module, "_RETRY_S", 0.01)
    controller = Controller()  # stopped: never answers
    subscriber = TableSubscriber(controller.listen, _connect, lost_error=RequestLostError)  # type: ignore[arg-type]
    subscriber.watch(APPLICATIONS_KEY, lambda table: None)
    await wait_for_async(lambda: controller.calls >= 3, what="the poll to give up and try again")
    subscriber.close()
    await asyncio.sleep(0)


class CountingController:
    """Answers each key once at version 1; counts the polls out at a time and what each asked."""

    def __init__(self) -> None:
        self.outstanding = 0
        self.most_outstanding = 0
        self.asked: list[set[str]] = []

    async def listen(self, known: Versions, timeout_s: float) -> Updates:
        self.outstanding += 1
        self.most_outstanding = max(self.most_outstanding, self.outstanding)
        self.asked.append(set(known))
        try:
            updates = {key: Update(1, STORED_ROUTES) for key, version in known.items() if version != 1}
            if not updates:
                await asyncio.sleep(timeout_s)
            return updates
        finally:
            self.outstanding -= 1


async def test_one_long_poll_covers_every_key_and_a_new_key_joins_it() -> None:
    controller = CountingController()
    subscriber = TableSubscriber(controller.listen, _connect, lost_error=RequestLostError)  # type: ignore[arg-type]
    seen: dict[str, list[Table | None]] = {}
    keys = [f"key-{i}" for i in range(50)]
    for key in keys:
        subscriber.watch(key, seen.setdefault(key, []).append)
    await wait_for_async(lambda: all(seen[key] == [STORED_ROUTES] for key in keys), what="every key's table")
    # One poll at a time for all fifty keys, not one per key.
    assert controller.most_outstanding == 1
    assert controller.asked[0] == set(keys)
    # A key watched while the poll waits: the poll starts again with it, at once.
    late: list[Table | None] = []
    subscriber.watch("late", late.append)
    await wait_for_async(lambda: late == [STORED_ROUTES], what="the late key's table")
    assert controller.asked[-1] >= {"late", *keys}
    assert controller.most_outstanding == 1
    subscriber.close()
    await asyncio.sleep(0)


async def test_a_second_watcher_of_a_key_starts_from_the_table_already_held() -> None:
    controller = CountingController()
    subscriber = TableSubscriber(controller.listen, _connect, lost_error=RequestLostError)  # type: ignore[arg-type]
    first: list[Table | None] = []
    subscriber.watch("key", first.append)
    await wait_for_async(lambda: first == [STORED_ROUTES], what="the first watcher's table")
    second: list[Table | None] = []
    ready = subscriber.watch("key", second.append)
    assert ready.is_set() and second == [STORED_ROUTES]  # at once, not at the next change
    subscriber.close()
    await asyncio.sleep(0)


async def test_holds_waits_for_the_version_a_deploy_published() -> None:
    controller = Controller()  # down: the subscriber holds nothing yet
    subscriber = TableSubscriber(controller.listen, _connect, lost_error=RequestLostError)  # type: ignore[arg-type]
    subscriber.watch(APPLICATIONS_KEY, lambda table: None)
    assert not await subscriber.holds(APPLICATIONS_KEY, 1, timeout_s=0.05)
    waiting = asyncio.ensure_future(subscriber.holds(APPLICATIONS_KEY, 1, timeout_s=5))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    controller.up.set()  # the controller answers with version 1
    assert await asyncio.wait_for(waiting, 5)
    assert await subscriber.holds(APPLICATIONS_KEY, 1, timeout_s=0)
    assert not await subscriber.holds(APPLICATIONS_KEY, 2, timeout_s=0.02)
    subscriber.close()
    await asyncio.sleep(0)
