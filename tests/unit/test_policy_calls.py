"""Calls of custom autoscaling policies: each on a loop in a daemon thread of its own,
bounded in time; calls within their bound never refused, abandoned ones still running bounded."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from app_toolkit._runtime.controller.policy_calls import Answered, Failed, PolicyCalls
from tests.waiting import wait_for


def test_each_policy_runs_on_a_loop_of_its_own_that_runs_its_tasks_between_calls() -> None:
    release = threading.Event()
    calls = PolicyCalls(timeout_s=60.0)
    ticks: list[int] = []

    async def tick() -> None:
        while True:
            ticks.append(len(ticks))
            await asyncio.sleep(0.01)

    def start_ticking(context: object) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(tick())  # a call sees a running loop

    try:
        calls.start("hung", lambda context: release.wait(10), None, now=0.0)
        calls.start("other", lambda context: threading.current_thread().daemon, None, now=0.0)
        assert wait_for(lambda: calls.take("other", now=1.0), 5) == Answered(True)  # not behind "hung"
        calls.start("other", start_ticking, None, now=1.0)
        task = wait_for(lambda: calls.take("other", now=1.0), 5)
        assert isinstance(task, Answered) and isinstance(task.value, asyncio.Task)
        wait_for(lambda: len(ticks) > 3, 5, "the task to run between calls")
        calls.forget("other")  # returns at once; the loop cancels and awaits the task, then ends
        wait_for(task.value.cancelled, 5, "the forgotten policy's task to end")
    finally:
        release.set()
        calls.close()
    ours = {"app-toolkit-policy-hung", "app-toolkit-policy-other"}
    assert not [thread for thread in threading.enumerate() if thread.name in ours]  # close() joined them


def test_many_policy_calls_within_their_bound_are_never_refused() -> None:
    """One call per deployment per pass: a cluster of 100 deployments whose policies take
    a while runs 100 at once, none hung (a bound on all running calls refused 36)."""
    release = threading.Event()
    calls = PolicyCalls(timeout_s=60.0)
    try:
        for key in range(100):
            calls.start(key, lambda context: release.wait(10), None, now=0.0)
        release.set()
        outcomes: dict[int, object] = {}
        deadline = time.monotonic() + 10
        while len(outcomes) < 100 and time.monotonic() < deadline:
            for key in set(range(100)) - set(outcomes):
                outcome = calls.take(key, now=1.0)
                if outcome is not None:
                    outcomes[key] = outcome
        assert set(outcomes.values()) == {Answered(True)}
    finally:
        release.set()
        calls.close()


def test_abandoned_policy_calls_still_running_are_bounded() -> None:
    """Past their bound or forgotten, hung calls' threads run on: past the limit of them
    a new call is not made, until one ends."""
    release = threading.Event()
    forgotten_runs = threading.Event()
    calls = PolicyCalls(timeout_s=1.0, max_abandoned=2)

    def hang_forgotten(context: object) -> bool:
        forgotten_runs.set()
        return release.wait(10)

    try:
        calls.start("overdue", lambda context: release.wait(10), None, now=0.0)
        calls.start("forgotten", hang_forgotten, None, now=0.0)
        calls.start("healthy", lambda context: release.wait(10), None, now=0.0)
        assert calls.take("overdue", now=2.0) == Failed("did not answer within 1 s")
        # Forgotten once it runs: a call not started yet is cancelled instead (not abandoned).
        assert forgotten_runs.wait(10)
        calls.forget("forgotten")
        calls.start("refused", lambda context: 1, None, now=2.0)
        refused = calls.take("refused", now=2.0)
        assert isinstance(refused, Failed) and "2 abandoned policy calls" in refused.error
        release.set()  # the abandoned calls end: room again
        outcome = None
        deadline = time.monotonic() + 5
        while not isinstance(outcome, Answered) and time.monotonic() < deadline:
            calls.start("again", lambda context: 2, None, now=3.0)
            while calls.running("again") and time.monotonic() < deadline:
                outcome = calls.take("again", now=3.0)
        assert outcome == Answered(2)
    finally:
        release.set()
        calls.close()


def test_a_thread_that_cannot_start_fails_its_call_not_the_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    calls = PolicyCalls()
    calls.start("D", lambda context: 1, None, now=0.0)
    assert calls.take("D", now=0.0) == Failed("raised RuntimeError: can't start new thread")
