"""Forwarding a request whose replica is lost: a safe one (GET, HEAD, OPTIONS) the proxy
holds whole is sent once more to another replica; any other is answered 502."""

from __future__ import annotations

import pytest
from starlette.types import Message

from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.front.forward import forward
from app_toolkit._runtime.messages import LOST, DeploymentID, HTTPRequest, HTTPResponse, ReplicaInfo, Request
from app_toolkit._runtime.routing.dispatcher import Dispatcher
from app_toolkit.exceptions import RequestLostError
from tests.unit.scopes import cycle_for

pytestmark = pytest.mark.anyio

DEP = DeploymentID("app", "Ingress")


class Replica:
    """Loses every request it gets (``lost``), or answers it 200."""

    def __init__(self, replica_id: str, lost: bool) -> None:
        self.replica_id = replica_id
        self.lost = lost
        self.received = 0

    async def open(self, request: Request) -> Exchange:
        self.received += 1
        exchange = Exchange(lambda: None)
        exchange.push(LOST if self.lost else HTTPResponse(200, [(b"content-length", b"2")], b"ok"))
        return exchange

    def close(self) -> None:
        pass


def _dispatcher(*replicas: Replica) -> Dispatcher:
    by_id = {replica.replica_id: replica for replica in replicas}
    # by_id holds stand-ins with open() and close()
    dispatcher = Dispatcher(DEP, lambda info: by_id[info.replica_id], lost_error=RequestLostError)
    dispatcher.update([ReplicaInfo(r.replica_id, DEP, "127.0.0.1", 1, b"t", 10) for r in replicas], 100)
    return dispatcher


async def _status(dispatcher: Dispatcher, method: str, more_body: bool = False) -> int:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    cycle = cycle_for(send, method)
    request = HTTPRequest("rid", {"type": "http", "method": method, "path": "/"}, b"", more_body)
    await forward(dispatcher, request, cycle)
    return int(sent[0]["status"])


async def test_a_safe_request_is_sent_once_more_to_another_replica() -> None:
    for method in ("GET", "HEAD", "OPTIONS"):
        lost, good = Replica("lost", lost=True), Replica("good", lost=False)
        # Whichever it reaches first, it is answered by the one that answers.
        assert await _status(_dispatcher(lost, good), method) == 200
        assert good.received == 1 and lost.received <= 1


async def test_only_once() -> None:
    first, second = Replica("a", lost=True), Replica("b", lost=True)
    assert await _status(_dispatcher(first, second), "GET") == 502
    assert first.received == second.received == 1


async def test_others_may_have_run_and_are_answered_502() -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        lost = Replica("lost", lost=True)
        assert await _status(_dispatcher(lost), method) == 502
        assert lost.received == 1
    streamed = Replica("lost", lost=True)  # its body streams: the proxy does not hold it whole
    assert await _status(_dispatcher(streamed), "GET", more_body=True) == 502
    assert streamed.received == 1
