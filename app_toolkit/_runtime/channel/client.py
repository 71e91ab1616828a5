"""The caller's end of the channel: one persistent connection per replica, requests
multiplexed over it by number (frames in ``frames.py``)."""

from __future__ import annotations

import asyncio
import logging
import select
import ssl

from app_toolkit._runtime.channel import handshake
from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.channel.flow import Credits, frame_cost, parts_cost
from app_toolkit._runtime.channel.frames import (
    MAX_FRAME_BYTES,
    STREAMED,
    Dumps,
    FrameProtocol,
    Kind,
    decode_answer,
    decode_credit,
    encode_credit,
    encode_request,
    plain_dumps,
)
from app_toolkit._runtime.messages import LOST, TERMINAL, CallFailure, ClientMessage, Request
from app_toolkit.exceptions import ReplicaUnavailableError

logger = logging.getLogger("app_toolkit.channel")

#: poll() events that say the replica's end is closed (none where poll() is missing;
#: POLLRDHUP, a peer's close with nothing left to read, is Linux's).
_CLOSED_EVENTS = (
    getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR | select.POLLNVAL
    if hasattr(select, "poll")
    else 0
)


def _undecodable(kind: Kind, error: str) -> CallFailure:
    what = "stream item" if kind is Kind.ITEM else "reply"
    return CallFailure.type_error(
        f"The replica's {what} could not be decoded here ({error}); its "
        "classes must be importable in the caller's process, with the same versions"
    )


class _ClientConnection(FrameProtocol):
    def __init__(self, token: bytes) -> None:
        super().__init__()
        self.pending: dict[int, Exchange] = {}
        self._token = token
        self._nonce = handshake.nonce()
        #: Done once the replica has proven it holds the token (False: it failed to).
        self.proven: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.max_receive = handshake.MAX_HANDSHAKE_FRAME  # until the replica has proven itself
        self._fd = -1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None else -1
        self.send(Kind.HELLO, 0, [self._nonce])

    def peer_gone(self) -> bool:
        """Whether the replica has closed its end while this side has not read that yet
        (its process died a moment ago, and the loop has not run the read since): a
        request written now could not run, yet would come back as lost. One poll, no
        wait."""
        transport = self.transport
        if transport is not None and transport.is_closing():
            return True  # TLS: its socket may be closed a turn before connection_lost
        if self._fd < 0 or not _CLOSED_EVENTS:
            return False
        poller = select.poll()
        poller.register(self._fd, _CLOSED_EVENTS)
        return any(events & _CLOSED_EVENTS for _, events in poller.poll(0))

    def _check_replica(self, kind: Kind, payload: memoryview) -> None:
        """The caller's side of the handshake (handshake.py)."""
        size = handshake.NONCE_BYTES
        if kind is Kind.CHALLENGE and len(payload) == size + handshake.PROOF_BYTES:
            replica_nonce = bytes(payload[:size])
            if handshake.matches(
                handshake.replica_proof(self._token, self._nonce, replica_nonce), payload[size:]
            ):
                self.send(Kind.PROOF, 0, [handshake.caller_proof(self._token, self._nonce, replica_nonce)])
                self.max_receive = MAX_FRAME_BYTES
                self.proven.set_result(True)
                return
        self.proven.set_result(False)
        self.drop()

    def on_frame(self, kind: Kind, number: int, payload: memoryview) -> None:
        if not self.proven.done():
            self._check_replica(kind, payload)
            return
        exchange = self.pending.get(number)
        if exchange is None:
            return
        if kind is Kind.CREDIT:
            exchange.credited(decode_credit(payload))
            return
        try:
            answer = decode_answer(kind, payload)
        except Exception as exc:  # noqa: BLE001 - fail this call alone; the connection is fine
            # Only text leaves this block: the traceback holds views of the receive buffer.
            failure = _undecodable(kind, f"{type(exc).__name__}: {exc}")
        else:
            if isinstance(answer, TERMINAL):
                del self.pending[number]
            exchange.push(answer, frame_cost(len(payload)) if kind in STREAMED else 0)
            return
        logger.warning("Request %d: %s", number, failure.message)
        del self.pending[number]
        self.send(Kind.CANCEL, number, [])  # the rest of a stream is of no use
        exchange.push(failure)

    def on_lost(self) -> None:
        if not self.proven.done():
            self.proven.set_result(False)
        pending, self.pending = self.pending, {}
        for exchange in pending.values():
            exchange.push(LOST)


class ChannelClient:
    """The caller's connection to one replica, opened on first use."""

    def __init__(
        self,
        host: str,
        port: int,
        token: bytes,
        dumps: Dumps = plain_dumps,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.token = token
        self.dumps = dumps
        self.tls = tls
        self._conn: _ClientConnection | None = None
        self._connecting: asyncio.Future[_ClientConnection] | None = None
        self._next = 0

    async def _connection(self) -> _ClientConnection:
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        try:
            return await asyncio.shield(self._connecting)
        finally:
            if self._connecting is not None and self._connecting.done():
                self._connecting = None

    async def _connect(self) -> _ClientConnection:
        loop = asyncio.get_running_loop()
        where = f"{self.host}:{self.port}"
        try:
            _transport, conn = await loop.create_connection(
                lambda: _ClientConnection(self.token),
                self.host,
                self.port,
                ssl=self.tls,
                ssl_handshake_timeout=handshake.HANDSHAKE_TIMEOUT_S if self.tls else None,
            )
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError
            raise ReplicaUnavailableError(f"Cannot reach replica at {where}: {exc}") from None
        try:
            proven = await asyncio.wait_for(asyncio.shield(conn.proven), handshake.HANDSHAKE_TIMEOUT_S)
        except TimeoutError:
            proven = False
        if not proven:
            conn.drop()
            raise ReplicaUnavailableError(
                f"The process at {where} did not prove it is the replica (it holds no valid "
                "token, or closed the connection); nothing was sent to it"
            )
        self._conn = conn
        return conn

    async def open(self, request: Request) -> Exchange:
        """Send one request; raises ReplicaUnavailableError if it could not be sent."""
        conn = await self._connection()
        # An idle connection is checked before use: the replica may have died since its
        # last answer. (A busy one is read all the time; what it has in flight is lost
        # with it whatever this request does.)
        if conn.closed or (not conn.pending and conn.peer_gone()):
            conn.drop()
            if self._conn is conn:
                self._conn = None
            raise ReplicaUnavailableError(f"Connection to {self.host}:{self.port} closed; nothing was sent")
        self._next += 1
        number = self._next
        kind, parts = encode_request(request, self.dumps)

        def cancel() -> None:
            if conn.pending.pop(number, None) is not None:
                conn.send(Kind.CANCEL, number, [])

        def forward(message: ClientMessage) -> int:
            next_kind, parts = encode_request(message, self.dumps)
            conn.send(next_kind, number, parts)
            return parts_cost(parts)

        def grant(amount: int) -> None:
            conn.send(Kind.CREDIT, number, encode_credit(amount))

        exchange = Exchange(cancel, forward, Credits(grant), request)
        conn.pending[number] = exchange
        # Requests sent in one loop turn (say, from clients whose requests arrived
        # together) leave in one write.
        conn.send(kind, number, parts, soon=True)
        await conn.drain()
        return exchange

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class UnreachableReplica:
    """A replica this process cannot talk to (say, TLS configured on one side only):
    every request fails with the reason, and the caller tries another replica."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def open(self, request: Request) -> Exchange:
        raise ReplicaUnavailableError(self.reason)

    def close(self) -> None:
        return None
