"""A replica's record_autoscaling_stats(): sampled every metrics_interval_s, handed to
the next load report, failures logged once and never fatal."""

from __future__ import annotations

import asyncio
import logging

import pytest

from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.replica.autoscaling_stats import AutoscalingStats
from app_toolkit.config import DeploymentConfig

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
        for _ in range(200):
            await asyncio.sleep(0.01)
            if calls:
                break
        assert calls and stats.take() is not None
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
