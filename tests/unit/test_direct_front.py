"""The front with the ingress replica of its own process as its upstream (direct
ingress), in process: what a request served there is labelled with in metrics, and the
span its app runs in."""

from __future__ import annotations

import asyncio
import json
import pickle
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from fastapi import FastAPI
from starlette.types import Message

import app_toolkit as tk
from app_toolkit import metrics
from app_toolkit._runtime.channel.exchange import Exchange as ChannelExchange
from app_toolkit._runtime.direct_ingress.replica_upstream import ReplicaUpstream
from app_toolkit._runtime.front.http_front import HTTPFront
from app_toolkit._runtime.front.request_link import REQUEST_LINK, ConnectionLink, Writes
from app_toolkit._runtime.messages import BUSY, DeploymentID, HTTPResponse, ReplicaInfo, Request, RouteInfo
from app_toolkit._runtime.replica.replica import ReplicaCore
from app_toolkit._runtime.routing.dispatcher import Dispatcher
from app_toolkit._runtime.tables import ApplicationTable
from app_toolkit.config import DeploymentConfig, HTTPOptions
from app_toolkit.exceptions import RequestLostError
from app_toolkit.tracing import current_trace
from tests.unit.scopes import http_scope
from tests.waiting import wait_for_async

pytestmark = pytest.mark.anyio

APP = "direct-labels"
DEPLOYMENT = DeploymentID(APP, "Ingress")
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"

app = FastAPI()


@app.get("/items/{item_id}")
async def item(item_id: int) -> dict[str, int]:
    return {"id": item_id}


@app.get("/slow")
async def slow() -> dict[str, str]:
    await asyncio.sleep(30)
    return {}


@app.get("/span")
async def span() -> dict[str, str]:
    trace = current_trace()
    assert trace is not None
    return {"trace": trace.trace_id, "span": trace.span_id, "parent": trace.parent_id}


@tk.ingress(app)
class Ingress:
    pass


class _NoPolicy:
    has_policy = False

    def serving_here(self, replica_id: str, count: Callable[[], int]) -> Callable[[], None]:
        return _nothing


class OneApp:
    """The front's table subscriber: this test's app at /shop, nothing else."""

    def watch(self, key: str, apply: Callable[[object], None]) -> asyncio.Event:
        apply(ApplicationTable((RouteInfo("/shop", APP, DEPLOYMENT),)))
        return asyncio.Event()

    def dispatcher(self, deployment: DeploymentID) -> _NoPolicy:
        return _NoPolicy()


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False


@pytest.fixture
async def core() -> AsyncIterator[ReplicaCore]:
    made = ReplicaCore("r1", DEPLOYMENT, DeploymentConfig(), Ingress, ((), {}), pickle.dumps)
    await made.start()
    made.enter_serving()
    yield made
    await made.drain()


class Exchange:
    """One request to the front as our HTTP protocol gives it (with a RequestLink)."""

    def __init__(self, path: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.link = ConnectionLink(Writes(_Transport()))  # type: ignore[arg-type]
        self.scope = http_scope(path, headers=[(b"host", b"testserver"), *(headers or [])])
        self.scope[REQUEST_LINK] = self.link
        self.sent: list[Message] = []

    async def run(self, front: HTTPFront) -> None:
        async def receive() -> Message:
            await asyncio.sleep(60)  # after the request: waiting for the client to leave
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            self.sent.append(message)

        await front(self.scope, receive, send)

    @property
    def status(self) -> int:
        return int(next(m["status"] for m in self.sent if m["type"] == "http.response.start"))

    def json(self) -> Any:
        return json.loads(
            b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        )


def _answered(route: str, status: str) -> float:
    found = metrics.value("app_toolkit_http_requests_total", application=APP, route=route, status=status)
    return float(found) if isinstance(found, float) else 0.0


def _front(core: ReplicaCore, **options: Any) -> HTTPFront:
    tables = OneApp()
    return HTTPFront(tables, HTTPOptions(**options), local=ReplicaUpstream(core, tables))  # type: ignore[arg-type]


async def test_a_request_served_in_the_replica_is_labelled_by_its_route_and_a_499_by_its_app(
    core: ReplicaCore,
) -> None:
    front = _front(core)
    before = _answered("/shop/items/{item_id}", "200"), _answered("/shop", "499")
    done = Exchange("/shop/items/7")
    await done.run(front)
    assert done.status == 200 and done.json() == {"id": 7}
    assert core.ongoing == 0  # its slot is back

    left = Exchange("/shop/slow")
    running = asyncio.ensure_future(left.run(front))
    await wait_for_async(lambda: core.direct_ongoing == 1)
    assert left.link.on_client_left is not None
    left.link.on_client_left()  # our protocol: the client's connection was lost
    await asyncio.wait_for(running, 5)
    assert left.sent == [] and core.ongoing == 0
    # A request its app never answered keeps its application's label, as on the channel path.
    assert (_answered("/shop/items/{item_id}", "200"), _answered("/shop", "499")) == (
        before[0] + 1,
        before[1] + 1,
    )


async def test_the_replicas_span_continues_the_clients_or_one_the_front_started(core: ReplicaCore) -> None:
    front = _front(core)
    continued = Exchange("/shop/span", [(b"traceparent", f"00-{TRACE}-{CLIENT_SPAN}-01".encode())])
    await continued.run(front)
    assert continued.json()["trace"] == TRACE and continued.json()["parent"] == CLIENT_SPAN

    started = Exchange("/shop/span")  # no traceparent: the trace starts at the front
    await started.run(front)
    seen = started.json()
    assert len(seen["trace"]) == 32 and len(seen["parent"]) == 16 and seen["span"] != seen["parent"]

    named = Exchange("/shop/span")  # the front names its trace in the headers the app sees
    await named.run(_front(core, request_id_headers=True))
    header = dict(named.scope["headers"])[b"traceparent"].decode().split("-")
    assert named.json()["trace"] == header[1] and named.json()["parent"] == header[2]


class _OtherReplica:
    """A replica of the deployment in another process: counts what it is sent; answers
    200, or BUSY as a full replica's admission does (``busy``)."""

    def __init__(self, replica_id: str, busy: bool) -> None:
        self.replica_id = replica_id
        self.busy = busy
        self.opened = 0

    async def open(self, request: Request) -> ChannelExchange:
        self.opened += 1
        exchange = ChannelExchange(lambda: None)
        exchange.push(BUSY if self.busy else HTTPResponse(200, [(b"content-length", b"2")], b"{}"))
        return exchange

    def close(self) -> None:
        pass


class TwoReplicas(OneApp):
    """The tables an ingress replica's front follows: this replica ("r1") and another."""

    def __init__(self, core: ReplicaCore, other: _OtherReplica) -> None:
        # Its own replica over the channel (loopback), answering as its admission would.
        self.itself = _OtherReplica(core.replica_id, busy=True)
        replicas = {"r1": self.itself, other.replica_id: other}
        self.table_dispatcher = Dispatcher(
            DEPLOYMENT,
            lambda info: replicas[info.replica_id],
            lost_error=RequestLostError,
        )
        infos = [ReplicaInfo(replica_id, DEPLOYMENT, "127.0.0.1", 1, b"t", 1) for replica_id in replicas]
        self.table_dispatcher.update(infos, 100)

    def dispatcher(self, deployment: DeploymentID) -> Dispatcher:  # type: ignore[override]
        return self.table_dispatcher


async def test_a_full_ingress_replica_sends_nothing_to_itself_over_the_channel() -> None:
    config = DeploymentConfig(max_ongoing_requests=1)
    core = ReplicaCore("r1", DEPLOYMENT, config, Ingress, ((), {}), pickle.dumps)
    await core.start()
    core.enter_serving()
    other = _OtherReplica("r2", busy=False)
    tables = TwoReplicas(core, other)
    front = HTTPFront(tables, HTTPOptions(), local=ReplicaUpstream(core, tables))  # type: ignore[arg-type]
    try:
        held = Exchange("/shop/slow")  # takes this replica's one slot
        running = asyncio.ensure_future(held.run(front))
        await wait_for_async(lambda: core.direct_ongoing == 1)
        for _ in range(8):  # its slot is taken: each goes to the other replica, in one hop
            sent = Exchange("/shop/items/1")
            await sent.run(front)
            assert sent.status == 200
        assert (tables.itself.opened, other.opened) == (0, 8)
        assert held.link.on_client_left is not None
        held.link.on_client_left()
        await asyncio.wait_for(running, 5)
    finally:
        await core.drain()


def _nothing() -> None:
    pass
