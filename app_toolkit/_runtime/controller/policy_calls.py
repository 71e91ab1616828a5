"""Calls of custom autoscaling policies, off the controller's event loop.

A policy is user code: it may be slow, hang or raise. Each policy's calls run on an
event loop of its own (``LoopThread``: a daemon thread, so a hung call neither delays
another policy's nor keeps the process from exiting), one call at a time; what a call
starts on that loop (an asyncio task that builds the policy's state in the background,
as Ray Serve's documented class policies do on the controller's loop) runs on between
its calls, until the policy is forgotten. A thread per policy is the price of sync
policies that block: one shared loop would let one stall every other.

Each call is bounded in time: the controller starts a call on one pass and takes its
outcome on a later one, so its loop never waits for user code. A call past its bound is
reported once as failed and then abandoned (a thread cannot be stopped); until it ends,
that policy is not called again. Calls within their bound are never refused, however
many run at once (one per policy); abandoned calls still running are bounded: with
``MAX_ABANDONED`` of them, a new call fails at once.

Forgetting a policy (its deployment or application deleted, the policy replaced or
overridden) cancels its call if it has not started, and stops its loop without waiting:
its tasks are cancelled and awaited there, then the thread ends. The loops being
stopped are kept until their threads end; ``close()`` stops every loop and joins them
all, within one bound, logging those that do not end (a call that blocks).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, Future
from dataclasses import dataclass

from app_toolkit._runtime.loop_thread import LoopThread

#: How long one call of a policy may take before it counts as failed.
POLICY_TIMEOUT_S = 10.0
#: Abandoned calls (past their bound, or forgotten) still running at most: their threads
#: cannot be stopped, so past this many a new call is not made.
MAX_ABANDONED = 64
#: How long ``close()`` waits for all policies' tasks and threads to end.
CLOSE_TIMEOUT_S = 5.0


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

    def __init__(
        self,
        timeout_s: float = POLICY_TIMEOUT_S,
        executor: Executor | None = None,
        max_abandoned: int = MAX_ABANDONED,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_abandoned = max_abandoned
        #: Where every call runs, if given (tests); else each key's own loop.
        self._executor = executor
        self._loops: dict[Hashable, LoopThread] = {}
        self._stopping: list[LoopThread] = []  # forgotten keys' loops, until their threads end
        self._calls: dict[Hashable, _Call] = {}
        # Abandoned calls not ended yet; each leaves it from its thread as it ends.
        self._abandoned: set[Future[object]] = set()
        self._lock = threading.Lock()

    def running(self, key: Hashable) -> bool:
        """Whether ``key``'s previous call has not ended (overdue ones included)."""
        return key in self._calls

    def start(
        self, key: Hashable, function: Callable[[object], object], argument: object, now: float
    ) -> None:
        """Call ``function(argument)`` on ``key``'s loop; ``now`` is the controller's clock."""
        if key in self._calls:
            raise RuntimeError(f"the autoscaling policy of {key} is still running")
        with self._lock:
            abandoned = len(self._abandoned)
        future: Future[object] = Future()
        if abandoned >= self.max_abandoned:
            future.set_exception(
                RuntimeError(
                    f"{abandoned} abandoned policy calls (past their bound, or of deleted "
                    "deployments) still run; this one was not made (does a policy hang?)"
                )
            )
        else:
            try:
                future = self._submit(key, function, argument)
            except Exception as exc:  # noqa: BLE001 - no thread to be had: this call fails, not the pass
                future.set_exception(exc)
        self._calls[key] = _Call(future, now)

    def _submit(
        self, key: Hashable, function: Callable[[object], object], argument: object
    ) -> Future[object]:
        if self._executor is not None:
            return self._executor.submit(function, argument)
        loop = self._loops.get(key)
        if loop is None:
            loop = self._loops[key] = LoopThread(f"app-toolkit-policy-{key}")
        return loop.call(lambda: function(argument))

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
            self._abandon(call.future)
            return Failed(f"did not answer within {self.timeout_s:g} s")
        return None

    def forget(self, key: Hashable) -> None:
        """``key`` is gone: its call, if any, is cancelled or abandoned, and its loop (with
        what the policy started there) stopped, without waiting for it."""
        call = self._calls.pop(key, None)
        if call is not None and not call.future.cancel():
            self._abandon(call.future)
        loop = self._loops.pop(key, None)
        if loop is not None:
            loop.stop_soon(CLOSE_TIMEOUT_S)
            self._stopping = [stopping for stopping in self._stopping if not stopping.done()]
            self._stopping.append(loop)

    def close(self) -> None:
        """Abandon the calls under way, stop every policy's loop and wait for them all
        (up to ``CLOSE_TIMEOUT_S`` in all; a loop a call blocks is logged and left)."""
        for call in self._calls.values():
            call.future.cancel()
        self._calls.clear()
        loops = [*self._loops.values(), *self._stopping]
        self._loops.clear()
        self._stopping.clear()
        for loop in loops:
            loop.stop_soon(CLOSE_TIMEOUT_S)
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        for loop in loops:
            loop.join(max(0.0, deadline - time.monotonic()))
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def _abandon(self, future: Future[object]) -> None:
        """Count ``future`` among the abandoned calls until it ends."""
        with self._lock:
            self._abandoned.add(future)
        future.add_done_callback(self._ended)  # at once if it has ended already

    def _ended(self, future: Future[object]) -> None:
        with self._lock:
            self._abandoned.discard(future)
