"""Direct ingress, the replica's side: a request or WebSocket of a connection an
ingress replica owns, served by that replica's app in this process
(docs/architecture.md, "Direct ingress").

The front (``front/``) applies every per-request rule as it does over the channel
(request id, deadline, limits, disconnect, access log, metrics, spans) and hands the
request to :class:`ReplicaUpstream`, its ``upstream.InReplica``: the app runs on the
scope the proxy would have forwarded (made in place), reads the body through the
request's one reader and answers the client through the request's ``HTTPCycle``.
Replica-process code.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

from starlette.types import Message, Receive, Send

from app_toolkit._runtime.front.cycle import HTTPCycle
from app_toolkit._runtime.front.scope import forward_in_place
from app_toolkit._runtime.front.websocket import SocketCycle
from app_toolkit._runtime.messages import DeploymentID, HTTPResponse
from app_toolkit._runtime.replica.replica import ReplicaCore
from app_toolkit._runtime.request_context import route_template
from app_toolkit._runtime.routing.subscriber import TableSubscriber


class _Answer:
    """The app's response to its own client (a ``run_app.HTTPOut``), written by the
    request's :class:`~app_toolkit._runtime.front.cycle.HTTPCycle`: its head held until the
    first body piece, so a whole response leaves in one write, and dropped once the body
    was refused (the cycle answers the refusal)."""

    __slots__ = ("_cycle", "_reader", "_head", "head_seen")

    def __init__(self, cycle: HTTPCycle) -> None:
        self._cycle = cycle
        self._reader = cycle.reader  # says the body's refusal, once it broke a bound
        self._head: Message | None = None
        self.head_seen = False

    @property
    def complete(self) -> bool:
        return self._cycle.finished

    def refused(self) -> bool:
        return self._reader.refusal != 0

    async def send(self, message: Message) -> None:
        if self._reader.refusal:
            return
        kind = message["type"]
        if kind == "http.response.body":
            head = self._head
            if head is not None:
                self._head = None
                await self._first_body(head, message)
            elif message.get("more_body", False):  # a stream's next piece: most of a stream
                await self._cycle.chunk(message.get("body", b""))
            else:
                await self._cycle.chunks((message.get("body", b""),), last=True)
        elif kind == "http.response.start":
            self._head = message
            self.head_seen = True
        else:
            await self._cycle.send_other(message)

    async def _first_body(self, head: Message, message: Message) -> None:
        """The held head goes out with the first body piece: a whole response, or a
        stream's start."""
        body: bytes = message.get("body", b"")
        cycle = self._cycle
        if message.get("more_body", False):  # a stream's metrics are labelled with its route from its start
            route = route_template(cycle.scope)
            await cycle.stream(int(head["status"]), head.get("headers", ()), route, body, head)
        else:  # its route is known when the app is done (end)
            await cycle.whole(int(head["status"]), head.get("headers", ()), body, cycle.route, head)

    def end(self) -> None:
        """The app is done (returned, raised or cancelled): a response it started, or the
        refusal of a body it read, is labelled with the route its routing recorded in the
        scope (one it never answered keeps its application's label, as on the channel
        path: a 499, a 504), and a streamed response is no longer open."""
        cycle = self._cycle
        if cycle.started or self._reader.refusal:
            cycle.routed(route_template(cycle.scope))
        cycle.stream_closed()

    async def answer(self, response: HTTPResponse) -> None:
        self._head = None
        self._cycle.routed(route_template(self._cycle.scope))
        await self._cycle.answer(response)

    async def cut_off(self, why: str) -> None:
        head, self._head = self._head, None
        cycle = self._cycle
        if head is not None:  # held: it goes out, as uvicorn had sent it at once
            status, headers, route = int(head["status"]), head.get("headers", ()), route_template(cycle.scope)
            try:
                await cycle.stream(status, headers, route)
            finally:
                await cycle.abort(why)
            return
        await cycle.abort(why)


class _Socket:
    """A WebSocket's messages from the app to its own client (a ``run_app.SocketOut``);
    its ``websocket.connect`` was read already and is given to the app again."""

    __slots__ = ("_receive", "_send", "_connected")

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self._connected = False

    async def receive(self) -> Message:
        if not self._connected:
            self._connected = True
            return {"type": "websocket.connect"}
        return await self._receive()

    async def emit(self, message: Message) -> None:
        await self._send(message)

    async def close_with(self, messages: Sequence[Message]) -> None:
        # A client that left first has nothing to be told (uvicorn raises ClientDisconnected,
        # an OSError): the app's return after its client left is no failure.
        with contextlib.suppress(OSError):
            for message in messages:
                await self._send(message)

    def restarted(self) -> None:
        pass  # the client, told to reconnect, closes: the app's next receive() hears it


class ReplicaUpstream:
    """The ingress replica of this process as the front's ``InReplica``: it serves the
    requests and WebSockets placed on it, each holding one of its slots while it runs.
    ``subscriber``: the front's tables; its dispatcher of this deployment counts the slots
    held here when it chooses a replica, so it sends this one nothing over the channel for
    them (a request would come back busy, one hop later)."""

    __slots__ = ("deployment", "has_room", "_core")

    def __init__(self, core: ReplicaCore, subscriber: TableSubscriber) -> None:
        self._core = core
        self.deployment: DeploymentID = core.deployment
        self.has_room = core.has_room  # bound once: asked for every request
        here = subscriber.dispatcher(core.deployment)
        core.on_direct_end = here.serving_here(core.replica_id, core.direct_count)

    async def http(self, cycle: HTTPCycle) -> None:
        assert cycle.matched is not None  # the cycle runs apps' requests here
        scope, core = cycle.scope, self._core
        trace = forward_in_place(
            scope, cycle.matched, cycle.headers, cycle.span_trace, id_headers=cycle.http.request_id_headers
        )
        async with core.slot():
            started = time.perf_counter()
            await core.serve_app(cycle.request_id, scope, cycle.app_receive, _Answer(cycle), trace, started)

    async def websocket(self, socket: SocketCycle) -> None:
        assert socket.matched is not None
        scope, id_headers = socket.scope, socket.http.request_id_headers
        trace = forward_in_place(scope, socket.matched, socket.headers, None, id_headers=id_headers)
        out, core = _Socket(socket.receive, socket.send), self._core
        async with core.slot():
            with socket.open():
                await core.serve_app(socket.request_id, scope, out.receive, out, trace, time.perf_counter())
