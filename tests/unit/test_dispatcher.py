"""The caller-side queue: bound, wake-up order, retries, cancellation (fake replicas)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.messages import (
    BUSY,
    DRAINING,
    LOST,
    CallResult,
    DeploymentID,
    MethodCall,
    ReplicaInfo,
    Request,
)
from app_toolkit._runtime.routing.dispatcher import Dispatcher
from app_toolkit._runtime.routing.replica_client import Reply
from app_toolkit.exceptions import BackPressureError, ReplicaUnavailableError, RequestLostError

pytestmark = pytest.mark.anyio

DEP = DeploymentID("app", "d")


def info(replica_id: str, capacity: int = 1) -> ReplicaInfo:
    return ReplicaInfo(replica_id, DEP, "127.0.0.1", 1, b"t", capacity)


class FakeReplica:
    """Answers each request with what ``behaviour`` says; records what it received."""

    def __init__(self, replica_id: str, behaviour: Callable[[Exchange, Any], None]) -> None:
        """``behaviour`` gets the exchange and the call's one argument."""
        self.replica_id = replica_id
        self.behaviour = behaviour
        self.received: list[Any] = []
        self.cancelled = 0
        self.closed = False

    async def open(self, request: Request) -> Exchange:
        def cancel() -> None:
            self.cancelled += 1

        assert isinstance(request, MethodCall)
        exchange = Exchange(cancel)
        self.received.append(request.args[0])
        self.behaviour(exchange, request.args[0])
        return exchange

    def close(self) -> None:
        self.closed = True


def call(argument: object) -> MethodCall:
    """A call with one argument (what a FakeReplica records and answers)."""
    return MethodCall("rid", "method", (argument,))


def answer(exchange: Exchange, message: Any) -> None:
    exchange.push(CallResult(f"done {message}"))


def result(reply: Reply) -> Any:
    assert isinstance(reply.first, CallResult), reply.first
    return reply.first.value


def make(replicas: dict[str, FakeReplica], max_queued: int, capacity: int = 1) -> Dispatcher:
    dispatcher = Dispatcher(DEP, lambda i: replicas[i.replica_id], lost_error=RequestLostError)
    dispatcher.update([info(name, capacity) for name in replicas], max_queued)
    return dispatcher


async def test_queue_is_bounded_and_drains_in_order() -> None:
    # The slot stays taken until the reply is released, so later requests queue.
    replica = FakeReplica("a", answer)
    dispatcher = make({"a": replica}, max_queued=2)
    running = await dispatcher.send(call(0))
    waiting = [asyncio.ensure_future(dispatcher.send(call(n))) for n in (1, 2)]
    await asyncio.sleep(0)
    assert dispatcher.queued == 2
    with pytest.raises(BackPressureError, match="max_queued_requests"):
        await dispatcher.send(call(3))
    running.release()
    first = await waiting[0]
    assert result(first) == "done 1"
    first.release()
    assert result(await waiting[1]) == "done 2"
    assert replica.received == [0, 1, 2]


async def test_requests_before_the_first_table_are_held_to_its_bound() -> None:
    # A caller that has no table yet queues; the first one's bound refuses the newest
    # beyond it, after the free slots took the oldest.
    replica = FakeReplica("a", answer)
    dispatcher = Dispatcher(DEP, lambda i: replica, lost_error=RequestLostError)
    waiting = [asyncio.ensure_future(dispatcher.send(call(n))) for n in range(5)]
    await asyncio.sleep(0)
    assert dispatcher.queued == 5
    dispatcher.update([info("a", capacity=1)], max_queued_requests=1)
    await asyncio.sleep(0)
    assert [w.done() for w in waiting] == [True, False, True, True, True]
    for refused in waiting[2:]:
        with pytest.raises(BackPressureError, match="has 1 requests queued"):
            refused.result()
    first = waiting[0].result()
    assert result(first) == "done 0"
    first.release()
    assert result(await waiting[1]) == "done 1"
    assert replica.received == [0, 1]


async def test_cancelled_waiter_never_reaches_a_replica() -> None:
    replica = FakeReplica("a", answer)
    dispatcher = make({"a": replica}, max_queued=5)
    running = await dispatcher.send(call("first"))
    queued = asyncio.ensure_future(dispatcher.send(call("second")))
    await asyncio.sleep(0)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    running.release()
    await asyncio.sleep(0)
    assert replica.received == ["first"]
    assert dispatcher.in_flight == 0


async def test_rejected_request_is_retried_on_another_replica() -> None:
    full = FakeReplica("a", lambda exchange, _: exchange.push(BUSY))
    free = FakeReplica("b", answer)
    dispatcher = make({"a": full, "b": free}, max_queued=5)
    for n in range(10):
        reply = await dispatcher.send(call(n))
        assert result(reply) == f"done {n}"
        reply.release()
    assert len(free.received) == 10
    assert len(full.received) <= 2  # skipped after it refused


async def test_a_draining_replica_gets_nothing_more_even_with_a_stale_table() -> None:
    leaving = FakeReplica("a", lambda exchange, _: exchange.push(DRAINING))
    staying = FakeReplica("b", answer)
    dispatcher = make({"a": leaving, "b": staying}, max_queued=5)
    for n in range(20):
        reply = await dispatcher.send(call(n))
        assert result(reply) == f"done {n}"
        reply.release()
    assert len(leaving.received) == 1  # one refusal, then it is left alone (no back-off retries)
    assert leaving.closed  # its connection closes once nothing uses it
    # A new table that lists it again brings it back.
    dispatcher.update([info("a"), info("b")], 5)
    assert "a" in dispatcher._chooser.replica_ids


async def test_unreachable_replica_is_dropped_and_request_retried() -> None:
    class Unreachable(FakeReplica):
        async def open(self, request: Request) -> Exchange:
            raise ReplicaUnavailableError("connection refused")

    dead = Unreachable("a", answer)
    alive = FakeReplica("b", answer)
    dispatcher = make({"a": dead, "b": alive}, max_queued=5)
    for n in range(6):
        (await dispatcher.send(call(n))).release()
    assert len(alive.received) == 6


async def test_lost_after_sending_is_an_error_not_a_retry() -> None:
    lost = FakeReplica("a", lambda exchange, _: exchange.push(LOST))
    dispatcher = make({"a": lost}, max_queued=5)
    with pytest.raises(RequestLostError, match="lost while it had the request; it may have run"):
        await dispatcher.send(call("x"))
    assert len(lost.received) == 1


async def test_requests_wait_for_the_first_replica_then_run() -> None:
    dispatcher = Dispatcher(DEP, lambda i: replica, lost_error=RequestLostError)
    replica = FakeReplica("a", answer)
    pending = asyncio.ensure_future(dispatcher.send(call("early")))
    await asyncio.sleep(0.01)
    assert not pending.done()
    dispatcher.update([info("a")], max_queued_requests=5)
    assert result(await pending) == "done early"


async def test_closing_fails_waiters_instead_of_hanging() -> None:
    dispatcher = Dispatcher(DEP, lambda i: FakeReplica("a", answer), lost_error=RequestLostError)
    pending = asyncio.ensure_future(dispatcher.send(call("x")))
    await asyncio.sleep(0)
    dispatcher.close("Deployment app/d was deleted")
    with pytest.raises(ReplicaUnavailableError, match="was deleted"):
        await pending


async def test_a_replica_leaving_the_table_keeps_its_connection_until_replies_end() -> None:
    leaving = FakeReplica("a", answer)
    dispatcher = make({"a": leaving}, max_queued=5)
    in_flight = await dispatcher.send(call("long"))
    dispatcher.close("Deployment app/d was deleted")  # e.g. the app is being deleted
    assert not leaving.closed  # the draining replica still owes this reply
    in_flight.release()
    assert leaving.closed


async def test_a_lone_replica_that_refuses_is_retried_until_it_accepts() -> None:
    refusals = 5

    def busy_then_free(exchange: Exchange, message: Any) -> None:
        nonlocal refusals
        if refusals:
            refusals -= 1
            exchange.push(BUSY)  # full because of another caller
        else:
            answer(exchange, message)

    replica = FakeReplica("a", busy_then_free)
    dispatcher = make({"a": replica}, max_queued=5, capacity=3)
    waiting = [asyncio.ensure_future(dispatcher.send(call(n))) for n in range(3)]
    replies = await asyncio.wait_for(asyncio.gather(*waiting), 5)  # never stranded
    assert result(replies[0]) == "done 0"
    for reply in replies:
        reply.release()


async def test_requests_served_in_the_callers_own_replica_count_when_it_chooses() -> None:
    # An ingress replica's front serves some requests in its own process (direct
    # ingress): its dispatcher counts them when it chooses a replica (sending that replica
    # nothing for the slots they hold), apart from what it sent, and again for a replica
    # that (re)joins its table; one of them ending lets a request waiting here go.
    own, other = FakeReplica("own", answer), FakeReplica("other", answer)
    dispatcher = make({"own": own, "other": other}, max_queued=4)
    here = 1
    ended = dispatcher.serving_here("own", lambda: here)
    first = await dispatcher.send(call(0))
    second = asyncio.ensure_future(dispatcher.send(call(1)))
    await asyncio.sleep(0)
    assert (own.received, other.received, dispatcher.queued) == ([], [0], 1)  # it waits...
    assert dispatcher.in_flight == 1  # ...and only what was sent runs from here
    here = 0
    ended()  # the own replica's request ended: the waiting one goes there
    replies = [first, await asyncio.wait_for(second, 5)]
    assert (own.received, other.received) == ([1], [0]) and dispatcher.in_flight == 2
    for reply in replies:
        reply.release()
    here = 1
    dispatcher.update([info("other")], 4)  # the own replica leaves the table, and comes back
    dispatcher.update([info("own"), info("other")], 4)
    assert result(await asyncio.wait_for(dispatcher.send(call(9)), 5)) == "done 9"
    assert other.received == [0, 9]
