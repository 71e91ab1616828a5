"""A replica's record_routing_stats(): sampled every request_routing_stats_period_s
whatever its deployment's router, sent when it changes (bounded, JSON), failures
logged once and never fatal; the controller writes it into the replica table, once per
report, ignoring a report older than the last; callers' routers read it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
from typing import Any

import pytest

from app_toolkit._runtime.messages import DeploymentID, ReplicaInfo
from app_toolkit._runtime.replica import routing_stats as routing_stats_module
from app_toolkit._runtime.replica.routing_stats import MAX_STATS_BYTES, RoutingStats
from app_toolkit._runtime.routing.choice import ReplicaChooser
from app_toolkit._runtime.tables import ReplicaRoutingStats, RouterChoice, replicas_key
from app_toolkit.config import DeploymentConfig
from app_toolkit.config.request_router import PREFIX_AWARE
from app_toolkit.request_router import PendingRequest
from tests.apps.routers import StatsRouter
from tests.unit.test_controller import FakeBackend, _replicas, app, started, until
from tests.waiting import wait_for_async

pytestmark = pytest.mark.anyio

DEP = DeploymentID("a", "D")
ROUTED: dict[str, Any] = {
    "request_router_class": PREFIX_AWARE,
    "request_routing_stats_period_s": 0.01,
    "request_routing_stats_timeout_s": 0.05,
}
CONFIG = DeploymentConfig(request_router_config=ROUTED)


class Reporting:
    """Answers each call with the next of ``answers`` (the last one repeats)."""

    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def record_routing_stats(self) -> object:
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        if answer == "hang":
            await asyncio.sleep(3600)  # past the timeout: cancelled there
        return answer


async def test_a_result_is_sent_once_until_it_changes_and_failures_keep_the_last_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert not RoutingStats.wanted(object())
    instance = Reporting(
        {"running": 2, "kv_cache_use": 0.5}, RuntimeError("engine gone"), "hang", {"bad": {1}}
    )
    stats = RoutingStats(instance, "r1", DEP, CONFIG)
    assert RoutingStats.wanted(instance) and stats.take() is None  # nothing before the first
    stats.start()
    try:
        first = await wait_for_async(stats.take, 2, "the first stats")
        assert first == ReplicaRoutingStats("r1", DEP, '{"kv_cache_use":0.5,"running":2}', 0)
        # Every later call fails (raises, overruns its timeout, returns what is not
        # JSON): the last good result stays, and is not sent again.
        await wait_for_async(lambda: instance.calls >= 6, 5, "calls that fail")
        assert stats.latest == first.stats and stats.take() is None
    finally:
        await stats.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("record_routing_stats() raised RuntimeError: engine gone" in w for w in warnings) == 1
    assert any("did not return within 0.05 s; request routers keep its last stats" in w for w in warnings)
    # Logged once, though every call after it fails the same way.
    assert sum("returned a dict that is not JSON" in w for w in warnings) == 1


async def test_a_changed_result_is_sent_and_an_unchanged_one_again_after_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    instance = Reporting({"waiting": 1})
    stats = RoutingStats(instance, "r1", DEP, CONFIG)
    stats.start()
    try:
        first = await wait_for_async(stats.take, 2, "the first stats")
        instance.answers = [{"waiting": 2}]
        second = await wait_for_async(stats.take, 2, "the changed stats")
        assert json.loads(second.stats) == {"waiting": 2} and second.sequence > first.sequence
        monkeypatch.setattr(routing_stats_module, "RESEND_S", 0.0)  # a report may have been lost
        again = stats.take()
        assert again is not None and again.stats == second.stats and again.sequence > second.sequence
    finally:
        await stats.stop()


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (["not", "a", "dict"], "not a dict with string keys"),
        ({1: 2}, "not a dict with string keys"),
        ({"nan": float("nan")}, "not JSON"),
        ({"big": "x" * MAX_STATS_BYTES}, f"more than the {MAX_STATS_BYTES} allowed"),
    ],
)
async def test_a_result_that_cannot_travel_in_the_tables_is_refused_by_name(
    caplog: pytest.LogCaptureFixture, answer: object, problem: str
) -> None:
    instance = Reporting(answer)
    stats = RoutingStats(instance, "r1", DEP, CONFIG)
    stats.start()
    try:
        await wait_for_async(lambda: instance.calls >= 2, 2, "two calls")
        assert stats.take() is None
    finally:
        await stats.stop()
    assert any(problem in r.getMessage() for r in caplog.records)


async def test_calls_run_whatever_the_router_and_follow_the_period() -> None:
    instance = Reporting({"running": 1})
    stats = RoutingStats(instance, "r1", DEP, DeploymentConfig())
    stats.start()
    try:
        # Power of two choices, Ray's period (10 s): the first call comes at the start, as
        # Ray's controller calls every replica that defines the method.
        await wait_for_async(stats.take, 2, "stats with the default router")
        assert instance.calls == 1
        stats.update(CONFIG)  # a shorter period, in place: the calls follow it
        await wait_for_async(lambda: instance.calls >= 3, 2, "calls at the new period")
        slow = {**ROUTED, "request_routing_stats_period_s": 3600.0}
        stats.update(DeploymentConfig(request_router_config=slow))
        calls = instance.calls
        await asyncio.sleep(0.05)
        assert instance.calls <= calls + 1  # an hour's period now (one call may have been due)
    finally:
        await stats.stop()


async def test_the_controller_publishes_changed_stats_once_per_report_and_ignores_older_ones() -> None:
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([app(request_router_config=ROUTED)])
    key = replicas_key(DEP)
    await until(lambda: len(_replicas(core, key).replicas) == 2)
    first, second = (info.replica_id for info in _replicas(core, key).replicas)
    version = core.longpoll.version(key)
    await core.record_load(
        "replica-process",
        {},
        (ReplicaRoutingStats(first, DEP, '{"running":3}', 1), ReplicaRoutingStats(second, DEP, "{}", 1)),
    )
    assert core.longpoll.version(key) == version + 1  # both replicas' stats, one table
    assert [info.routing_stats for info in _replicas(core, key).replicas] == ['{"running":3}', "{}"]
    # Late (a report that overran its timeout) or unchanged: no new table.
    await core.record_load("replica-process", {}, (ReplicaRoutingStats(first, DEP, '{"running":9}', 0),))
    await core.record_load("replica-process", {}, (ReplicaRoutingStats(first, DEP, '{"running":3}', 2),))
    assert core.longpoll.version(key) == version + 1
    assert _replicas(core, key).replicas[0].routing_stats == '{"running":3}'
    await core.stop()


def test_a_callers_router_reads_each_replicas_newest_stats() -> None:
    chooser = ReplicaChooser(random.Random(0))
    chooser.set_router(RouterChoice("tests.apps.routers:StatsRouter"))
    router = chooser.router
    assert isinstance(router, StatsRouter)
    a = ReplicaInfo("a", DEP, "127.0.0.1", 1, b"t", 2, routing_stats='{"running":1}')
    b = ReplicaInfo("b", DEP, "127.0.0.1", 1, b"t", 2)  # none yet
    chooser.set_replicas([a, b])
    assert router.latest == {"a": {"running": 1}, "b": {}}
    chooser.set_replicas([dataclasses.replace(a, routing_stats='{"running":0}'), b])
    assert router.latest == {"a": {"running": 0}, "b": {}}
    chosen = chooser.choose(0.0, pending=PendingRequest("r"))
    assert chosen is not None and router.chosen_from == {"a": {"running": 0}, "b": {}}
