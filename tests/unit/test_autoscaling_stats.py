"""A replica's record_autoscaling_stats(): sampled every metrics_interval_s, handed to
the next load report, failures logged once and never fatal."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine

import pytest

from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.replica.autoscaling_stats import AutoscalingStats
from app_toolkit._runtime.tables import ReplicaStats
from app_toolkit.config import DeploymentConfig
from tests.waiting import wait_for_async

pytestmark = pytest.mark.anyio

CONFIG = DeploymentConfig(autoscaling_config={"metrics_interval_s": 0.01})


class Reporting:
    def __init__(self) -> None:
        self.answers: list[object] = []

    async def record_autoscaling_stats(self) -> object:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


async def test_samples_reach_the_report_and_failures_are_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert not AutoscalingStats.wanted(object())
    instance = Reporting()
    instance.answers = [RuntimeError("gpu gone"), RuntimeError("gpu gone"), {"bad": "x"}, {"queue": 3}]
    stats = AutoscalingStats(instance, "r1", DeploymentID("a", "D"), CONFIG)
    assert AutoscalingStats.wanted(instance)
    stats.start()
    try:
        for _ in range(200):
            await asyncio.sleep(0.01)
            taken = stats.take()
            if taken is not None:
                break
        assert taken is not None and taken.replica_id == "r1" and taken.deployment == DeploymentID("a", "D")
        assert taken.samples and taken.samples[0][1] == (("queue", 3.0),) and taken.samples[0][0] >= 0
    finally:
        await stats.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("raised RuntimeError: gpu gone" in w for w in warnings) == 1  # once per distinct problem
    assert any("returned {'bad': 'x'}, not a dict of metric names to numbers" in w for w in warnings)


async def test_calls_wait_while_the_deployment_does_not_autoscale_and_start_when_it_does() -> None:
    calls: list[float] = []

    class Counting:
        def record_autoscaling_stats(self) -> dict[str, float]:
            calls.append(1.0)
            return {"queue": 1.0}

    stats = AutoscalingStats(Counting(), "r1", DeploymentID("a", "D"), DeploymentConfig(num_replicas=1))
    stats.start()
    try:
        await asyncio.sleep(0.1)
        assert calls == [] and stats.take() is None  # a fixed replica count: nobody reads them
        stats.update(CONFIG)  # autoscaling turned on in place
        # The sample is kept once the call (in a thread) has returned, not when it starts.
        await wait_for_async(stats.take, 2, "a kept sample")
        assert calls
        stats.update(DeploymentConfig(num_replicas=1))  # and off again: the calls pause
        await asyncio.sleep(0.05)
        paused = len(calls)
        await asyncio.sleep(0.1)
        assert len(calls) == paused
    finally:
        await stats.stop()


async def test_a_hung_async_call_is_cancelled_at_its_bound_and_sampling_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("app_toolkit._runtime.replica.autoscaling_stats.STATS_TIMEOUT_S", 0.05)
    cancelled: list[bool] = []

    class HangsOnce:
        calls = 0

        async def record_autoscaling_stats(self) -> dict[str, float]:
            self.calls += 1
            if self.calls == 1:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    cancelled.append(True)
                    raise
            return {"queue": 2.0}

    stats = AutoscalingStats(HangsOnce(), "r1", DeploymentID("a", "D"), CONFIG)
    stats.start()
    try:
        taken = None
        for _ in range(200):
            await asyncio.sleep(0.01)
            taken = stats.take()
            if taken is not None:
                break
        assert cancelled == [True] and taken is not None and taken.samples[0][1] == (("queue", 2.0),)
    finally:
        await stats.stop()


async def taken_sample(stats: AutoscalingStats) -> ReplicaStats | None:
    """The first samples a report takes, polled for up to 2 s."""
    for _ in range(200):
        await asyncio.sleep(0.01)
        taken = stats.take()
        if taken is not None:
            return taken
    return None


class HangsOnce:
    """Hangs on its first call until cancelled (and says so); then answers."""

    def __init__(self) -> None:
        self.calls = 0
        self.cancelled = 0

    async def __call__(self) -> dict[str, float]:
        self.calls += 1
        if self.calls == 1:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return {"queue": 2.0}


class AsyncCallable:
    """An object whose async ``__call__`` is the method: no coroutine function itself."""

    def __init__(self) -> None:
        self.record_autoscaling_stats = HangsOnce()


class SyncWrapper:
    """A sync method returning a coroutine (as a plain decorator makes)."""

    def __init__(self) -> None:
        self.hangs = HangsOnce()

    def record_autoscaling_stats(self) -> Coroutine[object, object, dict[str, float]]:
        return self.hangs()


@pytest.mark.parametrize("kind", [AsyncCallable, SyncWrapper])
async def test_any_call_that_runs_on_the_loop_is_cancelled_at_its_bound(
    monkeypatch: pytest.MonkeyPatch, kind: type[AsyncCallable | SyncWrapper]
) -> None:
    """Whatever makes a call async (an async ``__call__``, a returned coroutine), a hung
    one is cancelled at the bound and sampling goes on (it hung sampling for good)."""
    monkeypatch.setattr("app_toolkit._runtime.replica.autoscaling_stats.STATS_TIMEOUT_S", 0.05)
    instance = kind()
    hangs = instance.record_autoscaling_stats if isinstance(instance, AsyncCallable) else instance.hangs
    stats = AutoscalingStats(instance, "r1", DeploymentID("a", "D"), CONFIG)
    stats.start()
    try:
        taken = await taken_sample(stats)
        assert hangs.cancelled == 1 and taken is not None and taken.samples[0][1] == (("queue", 2.0),)
    finally:
        await stats.stop()


async def test_a_call_that_ignores_its_cancellation_is_not_stacked_nor_holds_up_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("app_toolkit._runtime.replica.autoscaling_stats.STATS_TIMEOUT_S", 0.05)
    monkeypatch.setattr("app_toolkit._runtime.replica.hook_sampler._STOP_WAIT_S", 0.1)
    release = asyncio.Event()
    calls: list[float] = []

    class Stubborn:
        async def record_autoscaling_stats(self) -> dict[str, float]:
            calls.append(1.0)
            while not release.is_set():
                try:
                    await release.wait()
                except asyncio.CancelledError:
                    pass  # swallowed: the call goes on
            return {"queue": 1.0}

    stats = AutoscalingStats(Stubborn(), "r1", DeploymentID("a", "D"), CONFIG)
    stats.start()
    try:
        await asyncio.sleep(0.3)  # its bound and many intervals pass
        assert calls == [1.0] and stats.take() is None  # one call at a time
        stopping = asyncio.ensure_future(stats.stop())
        stopped, _ = await asyncio.wait({stopping}, timeout=5)
        release.set()  # the call ends at last (and a stop() stuck on it with it)
        await stopping
        assert stopped  # it waited for the cancelled call without a bound
    finally:
        release.set()
        await stats.stop()


async def test_a_hung_sync_call_is_waited_for_not_stacked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its thread cannot be stopped: no new call (no new thread) until it returns."""
    monkeypatch.setattr("app_toolkit._runtime.replica.autoscaling_stats.STATS_TIMEOUT_S", 0.05)
    release = threading.Event()
    calls: list[float] = []

    class Blocking:
        def record_autoscaling_stats(self) -> dict[str, float]:
            calls.append(1.0)
            release.wait(10)
            return {"queue": 4.0}

    stats = AutoscalingStats(Blocking(), "r1", DeploymentID("a", "D"), CONFIG)
    stats.start()
    try:
        await asyncio.sleep(0.3)
        assert calls == [1.0] and stats.take() is None
        release.set()
        taken = await taken_sample(stats)
        assert taken is not None and taken.samples[0][1] == (("queue", 4.0),)
    finally:
        release.set()
        await stats.stop()
