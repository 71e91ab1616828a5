"""Calls of custom autoscaling policies, off the controller's event loop.

A policy is user code: it may be slow, hang or raise. Each call runs in a thread of a
small pool this object owns, one call per policy at a time, and is bounded in time: the
controller starts a call on one pass and takes its outcome on a later one, so its loop
never waits for user code. A call past its bound is reported once as failed and then
abandoned (a thread cannot be stopped); until it ends, that policy is not called again.
``close()`` cancels what has not started and abandons the rest, never waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass

#: How long one call of a policy may take before it counts as failed.
POLICY_TIMEOUT_S = 10.0
#: Threads running policies at once (a hung call keeps one until it ends).
_WORKERS = 4


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
        self._executor = executor or ThreadPoolExecutor(_WORKERS, thread_name_prefix="app-toolkit-policy")
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
        """Cancel the calls that have not started; abandon the running ones."""
        for call in self._calls.values():
            call.future.cancel()
        self._calls.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
