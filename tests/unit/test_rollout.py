"""Canary rollouts as a pure state machine (a fake clock), and in the controller with
callers' reports (a fake backend)."""

from __future__ import annotations

import re

import pytest

from app_toolkit._runtime.controller.rollout import MIN_REQUESTS, new_rollout
from app_toolkit._runtime.messages import AppSpec, DeploymentID
from app_toolkit._runtime.tables import ReplicaTable, VariantOutcome, replicas_key
from app_toolkit.config import RolloutOptions, parse_options
from app_toolkit.exceptions import ConfigError
from app_toolkit.metrics import SECONDS_BUCKETS
from tests.unit.test_controller import FakeBackend, app, started, until

APPS: dict[str, AppSpec] = {"chat": app("chat"), "chat-v2": app("chat-v2", prefix=None)}


def outcome(requests: int, errors: int = 0, seconds: float = 0.004) -> VariantOutcome:
    counts = [0] * (len(SECONDS_BUCKETS) + 1)
    counts[next(i for i, bound in enumerate(SECONDS_BUCKETS) if seconds <= bound)] = requests
    return VariantOutcome("chat", "chat-v2", requests, errors, tuple(counts))


def test_a_healthy_canary_goes_step_by_step_to_all_the_traffic() -> None:
    rollout = new_rollout(
        "chat",
        "chat-v2",
        RolloutOptions(steps=(10, 50, 100), interval_s=5.0, max_error_rate=0.05, max_p99_ms=200),
        APPS,
        now=0.0,
    )
    assert rollout.weights() == {"chat": 90.0, "chat-v2": 10.0}
    rollout.record(outcome(100, errors=2))  # 2 %: under the bound
    assert rollout.advance(4.9) is None
    assert rollout.advance(5.0) == "step"
    assert rollout.weights() == {"chat": 50.0, "chat-v2": 50.0}
    assert rollout.requests == 0  # each step is judged on its own requests
    assert rollout.advance(10.0) == "step"
    assert rollout.advance(15.0) == "done"
    assert rollout.weights() == {"chat-v2": 100.0} and rollout.state == "DONE"
    assert rollout.history[0] == "10 %: 100 canary requests, 2 errors, p99 5 ms"
    assert rollout.advance(100.0) is None


def test_errors_or_latency_over_the_bound_roll_back_at_once() -> None:
    rollout = new_rollout(
        "chat", "chat-v2", RolloutOptions(steps=(10, 100), max_error_rate=0.05), APPS, now=0.0
    )
    rollout.record(outcome(MIN_REQUESTS - 1, errors=MIN_REQUESTS - 1))
    assert rollout.advance(1.0) is None  # too few requests to judge yet
    rollout.record(outcome(1, errors=1))
    assert rollout.advance(1.5) == "rollback"
    assert rollout.weights() == {"chat": 100.0} and rollout.state == "ROLLED_BACK"
    assert rollout.reason == "error rate 100.0% of 20 canary requests is above max_error_rate 5.0%"
    # Reports about other splits, or after the end, change nothing.
    rollout.record(outcome(50))
    assert rollout.requests == MIN_REQUESTS

    slow = new_rollout(
        "chat", "chat-v2", RolloutOptions(steps=(10, 100), max_error_rate=None, max_p99_ms=100), APPS, now=0.0
    )
    slow.record(outcome(30, seconds=0.4))
    assert slow.advance(2.0) == "rollback"
    assert slow.reason == "p99 498 ms of 30 canary requests is above max_p99_ms 100"


@pytest.mark.parametrize(
    ("endpoint", "canary", "options", "message"),
    [
        ("nope", "chat-v2", {}, "No application to roll out 'nope'"),
        ("chat", "nope", {}, "No canary 'nope'"),
        ("chat", "chat", {}, "must be another application"),
        ("chat", "chat-v2", {"steps": (50, 10)}, "steps must be increasing percentages"),
        ("chat", "chat-v2", {"steps": (0, 100)}, "steps must be increasing percentages"),
        ("chat", "chat-v2", {"steps": ()}, "steps must be increasing percentages"),
        ("chat", "chat-v2", {"interval_s": 0}, "interval_s Input should be greater than 0"),
        ("chat", "chat-v2", {"max_error_rate": 5}, "max_error_rate Input should be less than 1"),
        ("chat", "chat-v2", {"max_p99_ms": -1}, "max_p99_ms Input should be greater than 0"),
        ("chat", "chat-v2", {"interval": 5}, "unknown option 'interval'"),
    ],
)
def test_bad_rollouts_say_what_to_fix(
    endpoint: str, canary: str, options: dict[str, object], message: str
) -> None:
    """Options are checked where they are given (one schema); the applications where the
    rollout starts."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        new_rollout(endpoint, canary, parse_options(RolloutOptions, options, "rollout"), APPS, now=0.0)


@pytest.mark.anyio
async def test_the_controller_rolls_back_when_callers_report_failures() -> None:
    backend = FakeBackend()
    core = await started(backend)
    for spec in APPS.values():
        await core.deploy_apps([spec])
    await core.rollout("chat", "chat-v2", RolloutOptions(steps=(10, 100), max_error_rate=0.05))
    ingress = replicas_key(DeploymentID("chat", "D"))
    table = core.longpoll.get(ingress)
    assert isinstance(table, ReplicaTable) and [share for _, share in table.split] == [0.9, 0.1]
    assert core.snapshot().applications["chat"].rollout is not None
    await core.record_load("proxy", {}, (outcome(40, errors=10),))
    await until(lambda: core.snapshot().applications["chat"].rollout.state == "ROLLED_BACK")  # type: ignore[union-attr]
    table = core.longpoll.get(ingress)
    assert isinstance(table, ReplicaTable) and table.split == ()
    status = core.snapshot().applications["chat"]
    assert (
        status.traffic == {} and status.rollout is not None and "error rate 25.0%" in status.rollout.message
    )
    assert any(e.level == "ERROR" and "rolled back" in e.message for e in core.snapshot().events)
    # Setting the traffic by hand stops a rollout under way.
    await core.rollout("chat", "chat-v2", RolloutOptions(steps=(10, 100), max_error_rate=0.05))
    await core.set_traffic("chat", {"chat": 1})
    rollout = core.snapshot().applications["chat"].rollout
    assert rollout is not None and rollout.state == "STOPPED" and "by hand" in rollout.message
    await core.stop()
