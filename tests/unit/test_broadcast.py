"""A broadcast on the caller's side (fake replicas) and in the replica: every replica of
the table gets the call past the queue and the slot limit, a draining one is left out, a
failing one gives its exception in its place while the others answer."""

from __future__ import annotations

import asyncio
import pickle
import threading
from types import SimpleNamespace
from typing import Any, cast

import pytest

from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.messages import BUSY, DRAINING, CallFailure, DeploymentID, MethodCall, beyond_limit
from app_toolkit._runtime.replica.replica import ReplicaCore
from app_toolkit._runtime.routing import broadcast
from app_toolkit._runtime.routing.data_plane import DataPlane
from app_toolkit._runtime.routing.dispatcher import Dispatcher
from app_toolkit.config import DeploymentConfig
from app_toolkit.exceptions import ReplicaUnavailableError, RequestTimeoutError
from app_toolkit.responses import DeploymentBroadcastResponse
from tests.unit.test_data_plane import NoController
from tests.unit.test_dispatcher import DEP, FakeReplica, answer, call, info, make, result


def fails(exchange: Exchange, message: Any) -> None:
    error = ValueError(f"no {message}")
    exchange.push(CallFailure("ValueError", str(error), pickle.dumps(error)))


def draining(exchange: Exchange, message: Any) -> None:
    exchange.push(DRAINING)


def plane_of(dispatcher: Dispatcher) -> DataPlane:
    """A data plane whose only table is ``dispatcher``'s."""

    async def dispatcher_with_table(deployment: DeploymentID) -> Dispatcher:
        assert deployment == DEP
        return dispatcher

    return cast(
        DataPlane, SimpleNamespace(subscriber=SimpleNamespace(dispatcher_with_table=dispatcher_with_table))
    )


@pytest.mark.anyio
async def test_send_to_skips_a_full_queue_and_a_busy_slot_and_leaves_a_draining_replica_out() -> None:
    replicas = {"a": FakeReplica("a", answer), "b": FakeReplica("b", draining)}
    dispatcher = make(replicas, max_queued=0)
    running = await dispatcher.send(call("first"))  # takes a's only slot
    reply = await dispatcher.send_to(info("a"), call("broadcast"))
    assert reply is not None and result(reply) == "done broadcast"
    reply.release()
    running.release()
    assert await dispatcher.send_to(info("b"), call("broadcast")) is None
    assert [r.replica_id for r in dispatcher.replicas()] == ["a"]  # b is sent nothing more
    assert dispatcher.in_flight == 0


@pytest.mark.anyio
async def test_send_to_a_replica_that_cannot_be_reached_raises() -> None:
    class Gone(FakeReplica):
        async def open(self, request: Any) -> Exchange:
            raise ReplicaUnavailableError("connection refused")

    dispatcher = make({"a": Gone("a", answer)}, max_queued=5)
    with pytest.raises(ReplicaUnavailableError, match="connection refused"):
        await dispatcher.send_to(info("a"), call("x"))


@pytest.mark.anyio
async def test_every_replica_answers_in_its_place_and_a_draining_one_is_left_out() -> None:
    replicas = {
        "a": FakeReplica("a", answer),
        "b": FakeReplica("b", fails),
        "c": FakeReplica("c", draining),
        "d": FakeReplica("d", answer),
    }
    dispatcher = make(replicas, max_queued=0)
    outcomes = await broadcast.fan_out(plane_of(dispatcher), DEP, call("reload"))
    assert all(replica.received == ["reload"] for replica in replicas.values())
    values = broadcast.results(outcomes, return_exceptions=True)
    assert values[0] == values[2] == "done reload"
    assert isinstance(values[1], ValueError) and str(values[1]) == "no reload"
    assert len(values) == 3  # c was draining
    with pytest.raises(ValueError, match="no reload"):
        broadcast.results(outcomes, return_exceptions=False)
    assert dispatcher.in_flight == 0


@pytest.mark.anyio
async def test_a_broadcast_to_no_replicas_has_no_results_and_to_a_deleted_deployment_raises() -> None:
    dispatcher = make({}, max_queued=5)
    assert await broadcast.fan_out(plane_of(dispatcher), DEP, call("reload")) == []
    dispatcher.close(f"Deployment {DEP} was deleted or failed to deploy")
    with pytest.raises(ReplicaUnavailableError, match="was deleted"):  # as a call to it would
        await broadcast.fan_out(plane_of(dispatcher), DEP, call("reload"))


@pytest.mark.anyio
async def test_a_full_replica_admits_a_broadcast_call_and_a_draining_one_refuses_it() -> None:
    config = DeploymentConfig(max_ongoing_requests=1)
    core = ReplicaCore("r1", DEP, config, lambda: None, ((), {}), pickle.dumps)
    assert core.admit() is None
    assert core.admit() == BUSY
    assert core.admit(beyond_limit=True) is None
    assert core.ongoing == 2
    core.draining = True
    assert core.admit(beyond_limit=True) == DRAINING


def test_only_a_broadcast_call_goes_beyond_the_limit() -> None:
    assert beyond_limit(MethodCall("r", "m", (), broadcast=True))
    assert not beyond_limit(MethodCall("r", "m", ()))


def test_a_timeout_ends_the_wait_not_the_broadcast_in_sync_and_async_code() -> None:
    plane = DataPlane(NoController())  # type: ignore[arg-type]
    answered = threading.Event()

    async def replicas_answer() -> list[broadcast.Outcome]:
        await asyncio.to_thread(answered.wait)
        return ["a", broadcast.Failed(ValueError("b"))]

    try:
        response = DeploymentBroadcastResponse(plane.submit(replicas_answer()))
        with pytest.raises(RequestTimeoutError):
            response.results(timeout_s=0.05)  # the replicas have not answered: the cause
        with pytest.raises(RequestTimeoutError):
            asyncio.run(response.results_async(timeout_s=0.05))
        assert not response.done()
        answered.set()
        assert response.results(timeout_s=5, return_exceptions=True)[0] == "a"
        with pytest.raises(ValueError, match="b"):
            asyncio.run(response.results_async(timeout_s=5))
    finally:
        answered.set()
        plane.close()
