"""The requests of one caller that wait for a free replica of a deployment, and who goes
next: fair shares between API keys.

Part of the caller-side queue (``dispatcher.py``): a request that finds no free replica
joins the line; each wake-up (a slot given back, a new table, a back-off ending) hands
the replicas the chooser finds free to the waiting requests.

Who goes next. Requests wait in one flow per API key (``request_values.Share``; requests
without a key share one flow, as a key of weight 1 and priority 0 would). A lower
priority class is served first; within a class, flows take turns by start-time fair
queuing: each flow has a pass, the next request served is the head of the flow with the
lowest, and serving it moves that pass on by ``1 / weight``. A flow that starts waiting
starts at the pass of the last request its class served, or at the pass its key had
reached when its last request left, if that is later: a quiet key's request goes ahead of
a busy key's queue (it waits about one turn), no key banks turns while it waits for
nothing, and a key of small weight whose requests come one at a time still waits its
turns between them. With one flow (no keys, or one key) this is first come first served.

Requests with a shard key may be passed over while their replica is full, so that
requests for free replicas are not held up behind them. When the line is full, a newcomer
takes the newest place of a key of a higher class, or else of the key of its own class
holding the most places for its weight, if that is more than the newcomer's key would
(:meth:`WaitingLine.make_room`). The bound a caller learns with its first table refuses
the newest requests beyond it, whatever their keys (:meth:`WaitingLine.refuse_beyond`).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Callable
from typing import NamedTuple

from app_toolkit._runtime.messages import ReplicaInfo
from app_toolkit._runtime.request_values import Share
from app_toolkit._runtime.routing.choice import Affinity, ReplicaChooser
from app_toolkit.request_router import PendingRequest

#: A timer may fire a hair early: a wake-up for a back-off's end comes this much later.
_WAKE_SLACK_S = 0.0005

#: Keys remembered as having left before those the clocks have passed are forgotten (a
#: key returning after its class's clock passed its pass starts at the clock anyway).
_LEFT_MAX = 256


class _Waiter(NamedTuple):
    """A waiting request: its future, multiplexed model id, shard key, what the
    deployment's request router reads of it (None without one), and its place in arrival
    order."""

    future: asyncio.Future[ReplicaInfo]
    model_id: str
    shard_key: str
    pending: PendingRequest | None
    arrival: int


#: A flow's identity: the priority class and the API key's name ("" without a key).
_FlowKey = tuple[int, str]

_NO_KEY = Share("")


def _key_of(share: Share) -> _FlowKey:
    return share.priority, share.key


def _step_of(share: Share) -> float:
    """How far one request served moves a flow's pass."""
    return 1.0 / share.weight


class _Flow:
    """The waiting requests of one API key, in arrival order, and its turn."""

    __slots__ = ("key", "waiters", "turn", "step")

    def __init__(self, share: Share, turn: float) -> None:
        self.key = _key_of(share)
        self.waiters: collections.deque[_Waiter] = collections.deque()
        self.turn = turn  # the pass of its next request served
        self.step = _step_of(share)

    def order(self) -> tuple[int, float, int]:
        """Lowest first: its class, its pass, its head's arrival."""
        return self.key[0], self.turn, self.waiters[0].arrival

    def live(self) -> int:
        """Its requests still waiting (not those given up on)."""
        return sum(1 for waiter in self.waiters if not waiter.future.done())


class WaitingLine:
    """The waiting requests of one deployment's dispatcher, and when they are served."""

    def __init__(self, chooser: ReplicaChooser) -> None:
        self._chooser = chooser
        self._flows: dict[_FlowKey, _Flow] = {}
        #: Per priority class: the pass of the last request it served (where a flow joins).
        self._clock: dict[int, float] = {}
        #: The pass each key's flow had reached when its last request left (a key that
        #: comes back before its class's clock passes it starts there).
        self._left: dict[_FlowKey, float] = {}
        self._left_max = _LEFT_MAX
        self._arrivals = itertools.count()
        self._keyed = 0  # waiters with a shard key
        self._timer: asyncio.TimerHandle | None = None
        #: Whether a request with a shard key waits for its own replica (the table's).
        self.affinity: Affinity = "strict"

    def __bool__(self) -> bool:
        return bool(self._flows)

    @property
    def queued(self) -> int:
        """Requests waiting now (those given up on while waiting are not counted)."""
        return sum(flow.live() for flow in self._flows.values())

    def join(
        self,
        model_id: str,
        shard_key: str,
        pending: PendingRequest | None = None,
        share: Share | None = None,
    ) -> asyncio.Future[ReplicaInfo]:
        """A request waits: the future it gets is set to the replica it may use (whose
        slot it holds), or to an error. ``share``: its API key's (None: no key)."""
        future: asyncio.Future[ReplicaInfo] = asyncio.get_running_loop().create_future()
        self._flow(share or _NO_KEY).waiters.append(
            _Waiter(future, model_id, shard_key, pending, next(self._arrivals))
        )
        if shard_key:
            self._keyed += 1
        return future

    def make_room(self, share: Share | None, refusal: Callable[[], BaseException]) -> bool:
        """The line is full: makes room for a newcomer with ``share`` by giving the newest
        request of another key ``refusal()`` (True), or says the newcomer is the one to
        refuse (False). That key is, of the highest class above the newcomer's, the one
        holding the most places for its weight; else, of the newcomer's class, the one
        holding the most places for its weight, if that is more than the newcomer's key
        would hold with it. A lower class is never refused for a higher one."""
        share = share or _NO_KEY
        own_key = _key_of(share)
        own = self._flows.get(own_key)
        own_load = (own.live() + 1) * own.step if own is not None else _step_of(share)
        chosen: tuple[tuple[int, float], _Flow] | None = None
        for flow in self._flows.values():
            live = flow.live()
            if flow is own or not live:
                continue
            if flow.key[0] > own_key[0]:
                rank = (flow.key[0], live * flow.step)  # the highest class first, however full
            elif flow.key[0] == own_key[0] and live * flow.step > own_load:
                rank = (flow.key[0], live * flow.step)
            else:
                continue
            if chosen is None or rank > chosen[0]:
                chosen = (rank, flow)
        if chosen is None:
            return False
        fullest = chosen[1]
        for index in range(len(fullest.waiters) - 1, -1, -1):
            waiter = fullest.waiters[index]
            if not waiter.future.done():
                del fullest.waiters[index]
                self._keyed -= 1 if waiter.shard_key else 0
                waiter.future.set_exception(refusal())
                break
        self._drop_if_empty(fullest)
        return True

    def fail_all(self, error: Callable[[], BaseException]) -> None:
        """Every waiting request gets ``error()`` (the deployment is gone)."""
        flows, self._flows = self._flows, {}
        self._left.clear()
        for flow in flows.values():
            for waiter in flow.waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(error())
        self._keyed = 0

    def refuse_beyond(self, bound: int, refusal: Callable[[], BaseException]) -> None:
        """The newest waiting requests beyond ``bound`` get ``refusal()``."""
        excess = self.queued - bound
        if excess <= 0:
            return
        newest = sorted(
            (waiter for flow in self._flows.values() for waiter in flow.waiters if not waiter.future.done()),
            key=lambda waiter: waiter.arrival,
        )[-excess:]
        for waiter in newest:
            waiter.future.set_exception(refusal())
        self._sweep()

    def wake(self) -> None:
        """Give the replicas free now to the requests that wait, in turn."""
        now = asyncio.get_running_loop().time()
        if self._keyed:
            self._wake_keyed(now)
            return
        while self._flows:
            flow = self._next_flow()
            head, model_id, _, pending, _ = flow.waiters[0]
            if head.done():
                flow.waiters.popleft()
                self._drop_if_empty(flow)
                continue
            choice = self._chooser.choose(now, model_id, pending=pending)
            if choice is None:
                self._wake_later(now)
                return
            flow.waiters.popleft()
            self._served(flow)
            self._drop_if_empty(flow)
            self._chooser.acquire(choice.replica_id, model_id, now)
            head.set_result(choice)

    def _wake_keyed(self, now: float) -> None:
        """Serve waiters in turn, looking past one whose replica is full: a request with
        another shard key (or none) may have a free replica. Requests without a shard key
        keep their order among themselves."""
        unkeyed_stuck = False
        # Per class, the pass of the first request passed over: one served after it, out of
        # turn, moves the class's clock no further (newcomers would start behind it).
        stuck: dict[int, float] = {}
        for flow, waiter, turn in self._in_turn():
            future, model_id, shard_key, pending, _ = waiter
            if future.done():  # given up on (those served here are marked as they go)
                continue
            choice = None
            if not (unkeyed_stuck and not shard_key) and self._chooser.any_free(now):
                choice = self._chooser.choose(now, model_id, shard_key, self.affinity, pending)
            if choice is None:
                unkeyed_stuck = unkeyed_stuck or not shard_key
                stuck.setdefault(flow.key[0], turn)
                continue
            self._served(flow, stuck.get(flow.key[0], flow.turn))
            self._chooser.acquire(choice.replica_id, model_id, now)
            future.set_result(choice)
        self._sweep()
        if self._flows:
            self._wake_later(now)

    def _flow(self, share: Share) -> _Flow:
        key = _key_of(share)
        flow = self._flows.get(key)
        if flow is None:
            clock = self._clock.get(share.priority, 0.0)
            flow = self._flows[key] = _Flow(share, max(clock, self._left.pop(key, clock)))
        return flow

    def _next_flow(self) -> _Flow:
        """The flow whose head goes next (the line is not empty)."""
        if len(self._flows) == 1:
            return next(iter(self._flows.values()))
        return min(self._flows.values(), key=_Flow.order)

    def _in_turn(self) -> list[tuple[_Flow, _Waiter, float]]:
        """Every waiter still waiting, with its flow and its pass, in the order turns would
        serve them."""
        ranked: list[tuple[tuple[int, float, int], _Flow, _Waiter]] = []
        for flow in self._flows.values():
            live = (waiter for waiter in flow.waiters if not waiter.future.done())
            for place, waiter in enumerate(live):
                ranked.append(((flow.key[0], flow.turn + place * flow.step, waiter.arrival), flow, waiter))
        if len(self._flows) > 1:
            ranked.sort(key=lambda entry: entry[0])
        return [(flow, waiter, order[1]) for order, flow, waiter in ranked]

    def _served(self, flow: _Flow, cap: float | None = None) -> None:
        """A request of ``flow`` was served: its class's clock and the flow's turn move.
        The clock never goes back, nor past ``cap`` (the shard-key path serves out of turn)."""
        priority = flow.key[0]
        reached = flow.turn if cap is None else min(flow.turn, cap)
        self._clock[priority] = max(self._clock.get(priority, reached), reached)
        flow.turn += flow.step

    def _drop_if_empty(self, flow: _Flow) -> None:
        """Forget ``flow`` if nothing of it waits, keeping the pass it reached."""
        if flow.waiters:
            return
        del self._flows[flow.key]
        if not self._flows:  # the line is empty: nothing left to take turns against
            self._left.clear()
        elif flow.turn > self._clock.get(flow.key[0], 0.0):
            self._left[flow.key] = flow.turn
            if len(self._left) > self._left_max:  # those the clocks have passed count no more
                self._left = {
                    key: turn for key, turn in self._left.items() if turn > self._clock.get(key[0], 0.0)
                }
                self._left_max = max(_LEFT_MAX, 2 * len(self._left))  # pruned again only after as many

    def _sweep(self) -> None:
        """Forget the waiters served or given up, and the flows left empty; count those
        left with a shard key."""
        keyed = 0
        for flow in list(self._flows.values()):
            if any(waiter.future.done() for waiter in flow.waiters):
                flow.waiters = collections.deque(
                    waiter for waiter in flow.waiters if not waiter.future.done()
                )
            keyed += sum(1 for waiter in flow.waiters if waiter.shard_key)
            self._drop_if_empty(flow)
        self._keyed = keyed

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
