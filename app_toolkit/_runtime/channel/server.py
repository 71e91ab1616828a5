"""The replica's end of the channel: accept connections, check the token, admit and run
requests, send their replies back as frames (see ``frames.py``)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
from typing import Protocol

from app_toolkit._runtime.channel import handshake
from app_toolkit._runtime.channel.flow import STREAM_WINDOW, Inbound, Window, frame_cost, parts_cost
from app_toolkit._runtime.channel.frames import (
    MAX_FRAME_BYTES,
    OPENING,
    STREAMED,
    Dumps,
    FrameProtocol,
    Kind,
    decode_body_piece,
    decode_client_message,
    decode_credit,
    decode_request,
    encode_answer,
    encode_credit,
    plain_dumps,
)
from app_toolkit._runtime.messages import (
    Answer,
    CallFailure,
    Rejected,
    Request,
    WebSocketOpen,
    beyond_limit,
    body_follows,
)

logger = logging.getLogger("app_toolkit.channel")


class ResponseSink(Protocol):
    """Where a replica sends the answers of one request (and, for WebSockets and streamed
    request bodies, reads the client's messages from ``inbound``). ``drain()`` after each
    answer of a stream waits for the connection and for the stream's flow-control window
    (``flow.py``)."""

    inbound: Inbound | None

    def send(self, answer: Answer) -> None: ...

    async def drain(self) -> None: ...


class RequestHandler(Protocol):
    """The replica side: serves one request, sending its answers into ``sink``."""

    def admit(self, beyond_limit: bool = False) -> Rejected | None:
        """Take a slot (None), or the refusal to answer; ``beyond_limit``: even when full
        (``messages.beyond_limit``)."""
        ...

    async def serve(self, request: Request, sink: ResponseSink) -> None: ...

    def unserved(self) -> None:
        """Give back the slot ``admit`` took for a request whose ``serve`` never ran (it
        was cancelled before its task started: the coroutine's body, and so its own
        ``finally``, never runs)."""
        ...


class _ServerSink:
    __slots__ = ("_conn", "_number", "inbound", "window")

    def __init__(self, conn: _ServerConnection, number: int) -> None:
        self._conn = conn
        self._number = number
        self.inbound: Inbound | None = None
        self.window = Window()

    def send(self, answer: Answer) -> None:
        kind, parts = encode_answer(answer, self._conn.dumps)
        if kind in STREAMED:
            self.window.sent(parts_cost(parts))
        # Replies finished in one loop turn (say, requests that arrived together) leave in
        # one write: one system call and one wake-up of the caller for all of them.
        self._conn.send(kind, self._number, parts, soon=True)

    async def drain(self) -> None:
        await self._conn.drain()
        await self.window.room()

    def grant(self, amount: int) -> None:
        """The app took ``amount`` of the client's messages: more may come."""
        self._conn.send(Kind.CREDIT, self._number, encode_credit(amount))


#: Open connections one replica accepts (every proxy and handle owner keeps one per
#: replica); beyond this, new ones are closed at once.
MAX_CONNECTIONS = 4096


class _Connections:
    """The live connections of one server (for the cap)."""

    def __init__(self) -> None:
        self.count = 0


class _ServerConnection(FrameProtocol):
    def __init__(
        self, handler: RequestHandler, token: bytes, dumps: Dumps, connections: _Connections
    ) -> None:
        super().__init__()
        self.handler = handler
        self.token = token
        self.dumps = dumps
        self.authenticated = False
        self._nonces: tuple[bytes, bytes] | None = None  # (caller's, ours) once HELLO came
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.sinks: dict[int, _ServerSink] = {}
        self.max_receive = handshake.MAX_HANDSHAKE_FRAME  # until the caller has proven itself
        self._connections = connections
        self._counted = False
        self._handshake: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._connections.count >= MAX_CONNECTIONS:
            logger.warning("Refusing a data-plane connection: %d are open already", MAX_CONNECTIONS)
            self.drop()
            return
        self._connections.count += 1
        self._counted = True
        self._handshake = asyncio.get_running_loop().call_later(
            handshake.HANDSHAKE_TIMEOUT_S, self._handshake_expired
        )

    def _handshake_expired(self) -> None:
        if not self.authenticated:
            logger.warning(
                "Closing a data-plane connection that did not prove the token within %s s",
                handshake.HANDSHAKE_TIMEOUT_S,
            )
            self.drop()

    def _authenticate(self, kind: Kind, payload: memoryview) -> None:
        """The replica's side of the handshake (handshake.py); a peer that breaks it is cut off."""
        if kind is Kind.HELLO and self._nonces is None and len(payload) == handshake.NONCE_BYTES:
            caller_nonce, our_nonce = bytes(payload), handshake.nonce()
            self._nonces = (caller_nonce, our_nonce)
            proof = handshake.replica_proof(self.token, caller_nonce, our_nonce)
            self.send(Kind.CHALLENGE, 0, [our_nonce, proof])
            return
        if kind is Kind.PROOF and self._nonces is not None:
            if handshake.matches(handshake.caller_proof(self.token, *self._nonces), payload):
                self.authenticated = True
                self.max_receive = MAX_FRAME_BYTES
                if self._handshake is not None:
                    self._handshake.cancel()
                return
        logger.warning("Closing a data-plane connection that did not prove it holds the token")
        self.drop()

    def on_frame(self, kind: Kind, number: int, payload: memoryview) -> None:
        if not self.authenticated:
            self._authenticate(kind, payload)
            return
        if kind is Kind.CANCEL:
            task = self.tasks.get(number)
            if task is not None:
                self._cancel(task)
            return
        if kind is Kind.CREDIT:
            sink = self.sinks.get(number)
            if sink is not None:
                sink.window.credited(decode_credit(payload))
            return
        if kind is Kind.WS_IN:
            sink = self.sinks.get(number)
            if sink is not None and sink.inbound is not None:
                sink.inbound.put(decode_client_message(payload).message, frame_cost(len(payload)))
            return
        if kind is Kind.BODY_IN:
            sink = self.sinks.get(number)
            if sink is not None and sink.inbound is not None:
                sink.inbound.put(decode_body_piece(payload), frame_cost(len(payload)))
            return
        if kind not in OPENING:
            raise ValueError(f"a caller sent a {kind.name} frame")  # closes the connection
        try:
            request = decode_request(kind, payload)
        except Exception as exc:  # noqa: BLE001 - fail this call alone; the connection is fine
            # Only text leaves this block: the traceback holds views of the receive buffer.
            error = f"{type(exc).__name__}: {exc}"
        else:
            self._start(number, request)
            return
        logger.warning("Request %d could not be decoded: %s", number, error)
        failure = CallFailure.type_error(
            f"The replica could not decode the request ({error}); the classes of its arguments "
            "must be importable in the replica's process, with the same versions"
        )
        self._answer(number, failure)

    def _answer(self, number: int, answer: Answer) -> None:
        kind, parts = encode_answer(answer, plain_dumps)
        self.send(kind, number, parts)

    def _start(self, number: int, request: Request) -> None:
        refused = self.handler.admit(beyond_limit(request))
        if refused is not None:
            self._answer(number, refused)
            return
        sink = self.sinks[number] = _ServerSink(self, number)
        if isinstance(request, WebSocketOpen):
            sink.inbound = Inbound(sink.grant)
        elif body_follows(request):
            # The caller sends the rest of the body once admitted: this first credit says so.
            sink.inbound = Inbound(sink.grant)
            sink.grant(STREAM_WINDOW)
        task = asyncio.get_running_loop().create_task(self.handler.serve(request, sink))
        self.tasks[number] = task

        def forget(_task: asyncio.Task[None]) -> None:
            self.tasks.pop(number, None)
            self.sinks.pop(number, None)

        task.add_done_callback(forget)

    def on_lost(self) -> None:
        if self._handshake is not None:
            self._handshake.cancel()
        if self._counted:
            self._counted = False
            self._connections.count -= 1
        for task in list(self.tasks.values()):
            self._cancel(task)

    def _cancel(self, task: asyncio.Task[None]) -> None:
        """Cancel a request's task; one cancelled before it started never serves, so its
        slot is given back here (a cancel that arrives with its request, in one read)."""
        created = inspect.getcoroutinestate(task.get_coro()) == inspect.CORO_CREATED  # type: ignore[arg-type]
        if created and not task.cancelling():  # (once: a second cancel finds it cancelling)
            self.handler.unserved()
        task.cancel()


async def start_server(
    handler: RequestHandler,
    host: str,
    token: bytes,
    dumps: Dumps = plain_dumps,
    tls: ssl.SSLContext | None = None,
) -> tuple[asyncio.Server, int]:
    """Listen on a free port of ``host`` (with TLS if ``tls`` is given); returns the
    server and the port."""
    loop = asyncio.get_running_loop()
    connections = _Connections()
    server = await loop.create_server(
        lambda: _ServerConnection(handler, token, dumps, connections),
        host=host,
        port=0,
        ssl=tls,
        ssl_handshake_timeout=handshake.HANDSHAKE_TIMEOUT_S if tls else None,
    )
    port = server.sockets[0].getsockname()[1]
    return server, int(port)
