"""Calls of custom autoscaling policies, off the controller's event loop.

A policy is user code: it may be slow, hang or raise. Each call runs in a daemon thread
of its own (a hung call neither delays another policy's nor keeps the process from
exiting), one call per policy at a time, and is bounded in time: the controller starts a
call on one pass and takes its outcome on a later one, so its loop never waits for user
code. A call past its bound is reported once as failed and then abandoned (a thread
cannot be stopped); until it ends, that policy is not called again. Abandoned calls
still running are bounded too: past ``MAX_RUNNING`` a new call fails at once.
``close()`` abandons what runs, never waiting.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

#: How long one call of a policy may take before it counts as failed.
POLICY_TIMEOUT_S = 10.0
#: Policy calls running at once at most (hung ones included: a thread cannot be stopped).
MAX_RUNNING = 64


class DaemonThreads(Executor):
    """Runs each call in a daemon thread of its own; at most ``limit`` at once."""

    def __init__(self, limit: int = MAX_RUNNING) -> None:
        self._limit = limit
        self._running = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._running >= self._limit:
                future.set_exception(
                    RuntimeError(f"{self._running} policy calls still run (hung?); this one was not made")
                )
                return future
            self._running += 1

        def run() -> None:
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(*args, **kwargs))
                    except BaseException as exc:  # noqa: BLE001 - the future carries it
                        future.set_exception(exc)
            finally:
                with self._lock:
                    self._running -= 1

        threading.Thread(target=run, name="app-toolkit-policy", daemon=True).start()
        return future


@dataclass(frozen=True, slots=True)
class Answered:
    """The call returned ``value``."""

    value: object


@dataclass(frozen=True, slots=True)
class Failed:
    """The call raised or overran its bound: ``error`` says which, in words."""

    error: str


@dataclass(slots=True)
class _Call:
    future: Future[object]
    started: float
    overdue: bool = False


class PolicyCalls:
    """One call at a time per key (a deployment, an application), each time-bounded."""

    def __init__(self, timeout_s: float = POLICY_TIMEOUT_S, executor: Executor | None = None) -> None:
        self.timeout_s = timeout_s
        self._executor = executor or DaemonThreads()
        self._calls: dict[Hashable, _Call] = {}

    def running(self, key: Hashable) -> bool:
        """Whether ``key``'s previous call has not ended (overdue ones included)."""
        return key in self._calls

    def start(
        self, key: Hashable, function: Callable[[object], object], argument: object, now: float
    ) -> None:
        """Call ``function(argument)`` in a thread; ``now`` is the controller's clock."""
        if key in self._calls:
            raise RuntimeError(f"the autoscaling policy of {key} is still running")
        self._calls[key] = _Call(self._executor.submit(function, argument), now)

    def take(self, key: Hashable, now: float) -> Answered | Failed | None:
        """The outcome of ``key``'s call if it has one now: once an answer or failure,
        once "overdue" when it passes its bound; None while it runs within its bound (or
        after it was reported overdue), or when there is no call."""
        call = self._calls.get(key)
        if call is None:
            return None
        if call.future.done():
            del self._calls[key]
            if call.overdue:
                return None  # its failure was reported; a late answer is not taken
            error = call.future.exception()
            if error is not None:
                return Failed(f"raised {type(error).__name__}: {error}")
            return Answered(call.future.result())
        if not call.overdue and now - call.started > self.timeout_s:
            call.overdue = True
            return Failed(f"did not answer within {self.timeout_s:g} s")
        return None

    def forget(self, key: Hashable) -> None:
        """``key`` is gone: its call, if any, is cancelled or abandoned."""
        call = self._calls.pop(key, None)
        if call is not None:
            call.future.cancel()

    def close(self) -> None:
        """Abandon the calls under way (their daemon threads end with the process)."""
        for call in self._calls.values():
            call.future.cancel()
        self._calls.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
