"""Direct ingress: a request of a connection an ingress replica owns, served by that
replica's app in this process (docs/architecture.md, "Direct ingress").

The front (``front/http_front.py``) applies every per-request rule as on the proxied path
(request id, deadline, limits, disconnect, access log, metrics, spans) and hands the
request to :class:`DirectIngress` (its ``front/local_ingress.LocalIngress``): here the app
runs on the scope the proxy would have forwarded, reads the body as it arrives (within
the bounds of ``body.BodyReader``, as on every path) and answers the client through the
request's ``HTTPCycle``. Replica-process code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Sequence

from starlette.types import Message, Receive, Scope, Send

from app_toolkit._runtime.front.body import BodyReader, refusal_answer
from app_toolkit._runtime.front.cycle import HTTPCycle
from app_toolkit._runtime.messages import HTTPResponse
from app_toolkit._runtime.replica.replica import ReplicaCore
from app_toolkit._runtime.request_context import route_template
from app_toolkit._runtime.tracing import TraceContext
from app_toolkit.config import HTTPOptions

_DISCONNECT: Message = {"type": "http.disconnect"}


class StreamedBody:
    """The request body as the app reads it, within the bounds every path keeps
    (:class:`~app_toolkit._runtime.front.body.BodyReader`). A body over a bound ends the
    app's reading with a disconnect; ``refusal`` says which (413, 408)."""

    __slots__ = ("_receive", "_reader", "_done")

    def __init__(self, receive: Receive, http: HTTPOptions, cycle: HTTPCycle) -> None:
        self._receive = receive
        self._reader = BodyReader(receive, http, cycle.link)
        self._done = False  # made only for a request that declares a body

    @property
    def refusal(self) -> int:
        """0, or the status the body was refused with (a declared length over the limit
        never gets here: http_front.py refuses it)."""
        return self._reader.refusal

    async def receive(self) -> Message:
        if self._reader.refusal:
            return _DISCONNECT
        if self._done:  # after the body: waiting for the client to leave, for as long as it takes
            return await self._receive()
        message = await self._reader.next()
        if message is None:
            return _DISCONNECT
        if message["type"] == "http.request":
            self._done = not message.get("more_body", False)
        return message


class _Answer:
    """The app's response to its own client (a ``run_app.HTTPOut``), written by the
    request's :class:`~app_toolkit._runtime.front.cycle.HTTPCycle`: its head held until the
    first body piece, so a whole response leaves in one write, and dropped when the body
    was refused (the refusal is the answer then)."""

    __slots__ = ("_cycle", "_body", "_scope", "_http", "_head", "head_seen")

    def __init__(self, cycle: HTTPCycle, body: StreamedBody | None, scope: Scope, http: HTTPOptions) -> None:
        self._cycle = cycle
        self._body = body
        self._scope = scope  # the app's routing records the matched route in it
        self._http = http
        self._head: Message | None = None
        self.head_seen = False

    @property
    def complete(self) -> bool:
        return self._cycle.finished

    async def send(self, message: Message) -> None:
        body_read = self._body
        if body_read is not None and body_read.refusal:
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
            route = route_template(self._scope)
            await cycle.stream(int(head["status"]), head.get("headers", ()), route, body, head)
        else:  # its route is known when the app is done (end)
            await cycle.whole(int(head["status"]), head.get("headers", ()), body, cycle.route, head)

    def end(self) -> None:
        """The app is done: a response it started is labelled with the route its routing
        recorded in the scope (one it never answered keeps its application's label, as on
        the channel path: a 499, a 504), and a streamed response is no longer open."""
        cycle = self._cycle
        if cycle.started:
            cycle.route = route_template(self._scope)
        cycle.stream_closed()

    def refusal(self) -> HTTPResponse | None:
        refused = self._body.refusal if self._body is not None else 0
        if not refused or self._cycle.started:
            return None
        return refusal_answer(refused, self._http, self._cycle.request_id)

    async def answer(self, response: HTTPResponse) -> None:
        self._head = None
        self._cycle.route = route_template(self._scope)
        await self._cycle.answer(response)

    async def cut_off(self, why: str) -> None:
        head, self._head = self._head, None
        if head is not None:  # held: it goes out, as uvicorn had sent it at once
            status, headers, route = int(head["status"]), head.get("headers", ()), route_template(self._scope)
            try:
                await self._cycle.stream(status, headers, route)
            finally:
                await self._cycle.abort(why)
            return
        await self._cycle.abort(why)


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


class DirectIngress:
    """The ingress replica of this process as the front's ``LocalIngress``: it serves the
    requests and WebSockets the front admits to it on the connections it owns."""

    __slots__ = ("deployment", "admit", "_core")

    def __init__(self, core: ReplicaCore) -> None:
        self._core = core
        self.deployment = core.deployment
        self.admit = core.admit  # bound once: called for every request

    def serve_http(
        self, scope: Scope, receive: Receive, cycle: HTTPCycle, http: HTTPOptions, trace: TraceContext | None
    ) -> Awaitable[None]:
        headers = cycle.headers
        body = StreamedBody(receive, http, cycle) if headers is not None and headers.has_body else None
        answer = _Answer(cycle, body, scope, http)
        reads = body.receive if body is not None else receive
        return self._core.serve_direct(cycle.request_id, scope, reads, answer, trace)

    def serve_websocket(
        self, request_id: str, scope: Scope, trace: TraceContext, receive: Receive, send: Send
    ) -> Awaitable[None]:
        socket = _Socket(receive, send)
        return self._core.serve_direct(request_id, scope, socket.receive, socket, trace)
