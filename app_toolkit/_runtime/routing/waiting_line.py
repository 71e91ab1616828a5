"""The requests of one caller that wait for a free replica of a deployment, in order.

Part of the caller-side queue (``dispatcher.py``): a request that finds no free replica
joins the line; each wake-up (a slot given back, a new table, a back-off ending) hands
the replicas the chooser finds free to the waiting requests, first come first served.
Requests with a shard key may be passed over while their replica is full, so that
requests for free replicas are not held up behind them.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from app_toolkit._runtime.messages import ReplicaInfo
from app_toolkit._runtime.routing.choice import Affinity, ReplicaChooser
from app_toolkit.request_router import PendingRequest

#: A timer may fire a hair early: a wake-up for a back-off's end comes this much later.
_WAKE_SLACK_S = 0.0005

#: A waiting request: its future, multiplexed model id, shard key, and what the
#: deployment's request router reads of it (None without one).
_Waiter = tuple[asyncio.Future[ReplicaInfo], str, str, PendingRequest | None]


class WaitingLine:
    """The waiting requests of one deployment's dispatcher, and when they are served."""

    def __init__(self, chooser: ReplicaChooser) -> None:
        self._chooser = chooser
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._keyed = 0  # waiters with a shard key
        self._timer: asyncio.TimerHandle | None = None
        #: Whether a request with a shard key waits for its own replica (the table's).
        self.affinity: Affinity = "strict"

    def __bool__(self) -> bool:
        return bool(self._waiters)

    @property
    def queued(self) -> int:
        """Requests waiting now (those given up on while waiting are not counted)."""
        return sum(1 for waiter in self._waiters if not waiter[0].done())

    def join(
        self, model_id: str, shard_key: str, pending: PendingRequest | None = None
    ) -> asyncio.Future[ReplicaInfo]:
        """A request waits: the future it gets is set to the replica it may use (whose
        slot it holds), or to an error."""
        future: asyncio.Future[ReplicaInfo] = asyncio.get_running_loop().create_future()
        self._waiters.append((future, model_id, shard_key, pending))
        if shard_key:
            self._keyed += 1
        return future

    def fail_all(self, error: Callable[[], BaseException]) -> None:
        """Every waiting request gets ``error()`` (the deployment is gone)."""
        while self._waiters:
            future = self._waiters.popleft()[0]
            if not future.done():
                future.set_exception(error())
        self._keyed = 0

    def refuse_beyond(self, bound: int, refusal: Callable[[], BaseException]) -> None:
        """The newest waiting requests beyond ``bound`` get ``refusal()``."""
        excess = self.queued - bound
        if excess <= 0:
            return
        kept: collections.deque[_Waiter] = collections.deque()
        for waiter in reversed(self._waiters):
            future, _, shard_key, _ = waiter
            if excess > 0 and not future.done():
                excess -= 1
                self._keyed -= 1 if shard_key else 0
                future.set_exception(refusal())
            else:
                kept.appendleft(waiter)
        self._waiters = kept

    def wake(self) -> None:
        """Give the replicas free now to the requests that wait, in order."""
        now = asyncio.get_running_loop().time()
        if self._keyed:
            self._wake_keyed(now)
            return
        while self._waiters:
            head, model_id, _, pending = self._waiters[0]
            if head.done():
                self._waiters.popleft()
                continue
            choice = self._chooser.choose(now, model_id, pending=pending)
            if choice is None:
                self._wake_later(now)
                return
            self._waiters.popleft()
            self._chooser.acquire(choice.replica_id, model_id, now)
            head.set_result(choice)

    def _wake_keyed(self, now: float) -> None:
        """Serve waiters in order, looking past one whose replica is full: a request
        with another key (or none) may have a free replica. Requests without a key keep
        their order among themselves."""
        kept: collections.deque[_Waiter] = collections.deque()
        unkeyed_stuck = False
        while self._waiters:
            waiter = self._waiters.popleft()
            future, model_id, shard_key, pending = waiter
            if future.done():
                self._keyed -= 1 if shard_key else 0
                continue
            choice = None
            if not (unkeyed_stuck and not shard_key) and self._chooser.any_free(now):
                choice = self._chooser.choose(now, model_id, shard_key, self.affinity, pending)
            if choice is None:
                kept.append(waiter)
                unkeyed_stuck = unkeyed_stuck or not shard_key
                continue
            self._keyed -= 1 if shard_key else 0
            self._chooser.acquire(choice.replica_id, model_id, now)
            future.set_result(choice)
        self._waiters = kept
        if kept:
            self._wake_later(now)

    def _wake_later(self, now: float) -> None:
        """Requests still wait; if a replica is only skipped for a back-off, come back
        when it ends (a timer may fire a hair early, so never rely on one)."""
        unblock = self._chooser.next_unblock(now)
        if unblock is None:
            return
        if self._timer is not None and not self._timer.cancelled():
            self._timer.cancel()
        delay_s = max(unblock - now + _WAKE_SLACK_S, 0.0)
        self._timer = asyncio.get_running_loop().call_later(delay_s, self.wake)
