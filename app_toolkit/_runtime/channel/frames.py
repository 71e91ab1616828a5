"""The request data plane's wire format: length-prefixed frames over one persistent TCP
connection.

Each replica listens on its own port; each caller process keeps one connection per
replica and multiplexes requests over it by request number. One frame each way carries
a unary request (docs/architecture.md, "Data plane"); streamed bodies are one frame per
chunk. The caller's end is ``client.py``, the replica's end ``server.py``.

Frame: ``!IQB`` header (payload length, request number, kind) then the payload. A
connection opens with a handshake (HELLO, CHALLENGE, PROOF; ``handshake.py``) in which each
side proves it holds the replica's token without sending it, so a stray process on the
network can neither drive a replica nor pose as one.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import struct
from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from app_toolkit._runtime.messages import (
    Answer,
    BodyChunk,
    CallFailure,
    CallResult,
    ClientMessage,
    HTTPRequest,
    HTTPResponse,
    HTTPResponseStart,
    MethodCall,
    Rejected,
    ReplicaLost,
    Request,
    RequestBodyPiece,
    StreamEnd,
    StreamItem,
    WebSocketMessage,
    WebSocketOpen,
)

if TYPE_CHECKING:
    from starlette.types import Message

logger = logging.getLogger("app_toolkit.channel")

HEADER = struct.Struct("!IQB")
#: What a frame that does not decode raises (an unknown kind, a payload that is not what
#: its kind says): the peer's fault. Anything else a frame's handling raises is ours.
_UNDECODABLE = (ValueError, struct.error, pickle.UnpicklingError, EOFError)
MAX_FRAME_BYTES = 1 << 31  # the largest frame either side sends or accepts
_HIGH_WATER = 4 << 20
_SOON_MAX = 64 << 10  # bigger frames, or this many bytes waiting, are written at once
_SOON_WINDOW_S = 0.001  # a frame this soon after the previous write waits for the turn's end
_PICKLE_PROTOCOL = 5

Dumps = Callable[[object], bytes]


class Kind(IntEnum):
    """What a frame carries (the wire's own vocabulary: nothing outside ``channel/``
    sees it; the parts speak in ``messages.Request`` and ``messages.Answer``)."""

    HELLO = 1
    HTTP = 2
    CALL = 3
    CANCEL = 4
    WS_OPEN = 5  # a WebSocket connection: the scope; then WS_IN frames with the client's messages
    WS_IN = 6
    CHALLENGE = 7  # the replica's nonce and proof (handshake.py)
    PROOF = 8  # the caller's proof
    CREDIT = 9  # flow control: bytes of this stream the sender of the frame consumed (flow.py)
    RESPONSE = 10
    START = 11
    BODY = 12
    END = 13
    RESULT = 14
    FAILURE = 15
    REJECTED = 16
    ITEM = 17  # one item of a streamed handle call; END or FAILURE follows the last
    WS_OUT = 18  # an ASGI message the app sent on a WebSocket; END follows the last
    BODY_IN = 19  # the next piece of a streamed request body: a "more" byte, then the bytes


#: The kinds of a stream's frames, which flow control counts (flow.py).
STREAMED = frozenset({Kind.BODY, Kind.ITEM, Kind.WS_OUT, Kind.WS_IN, Kind.BODY_IN})
#: The kinds that open a request.
OPENING = frozenset({Kind.HTTP, Kind.CALL, Kind.WS_OPEN})


def plain_dumps(value: object) -> bytes:
    return pickle.dumps(value, _PICKLE_PROTOCOL)


_HEAD_LENGTH = struct.Struct("!I")
_CREDIT = struct.Struct("!Q")
_DRAINING = b"d"  # the REJECTED frame's payload when the replica is shutting down
_MORE, _LAST = b"m", b"l"  # a BODY_IN frame's first byte: more pieces follow, or none
Frame = tuple[Kind, list[bytes]]


def _with_body(head: bytes, body: bytes) -> list[bytes]:
    """A small pickled head followed by the raw body, so a large body is never copied
    into a pickle."""
    return [_HEAD_LENGTH.pack(len(head)) + head, body]


def _split_body(payload: memoryview) -> tuple[Any, bytes]:
    (length,) = _HEAD_LENGTH.unpack_from(payload)
    return pickle.loads(payload[4 : 4 + length]), payload[4 + length :].tobytes()


def encode_request(request: Request | ClientMessage, dumps: Dumps) -> Frame:
    """The frame of a request (or of what the client sends on it: a WebSocket message,
    a piece of the body), as its parts. ``dumps`` serializes what carries user objects
    (call arguments)."""
    match request:
        case HTTPRequest():
            head = plain_dumps(
                (request.request_id, request.scope, request.more_body, request.trace, request.tracestate)
            )
            return Kind.HTTP, _with_body(head, request.body)
        case RequestBodyPiece():
            return Kind.BODY_IN, [_MORE if request.more else _LAST, request.data]
        case MethodCall():
            return Kind.CALL, [dumps(request)]
        case WebSocketMessage():
            return Kind.WS_IN, [plain_dumps(request.message)]
        case WebSocketOpen():
            return Kind.WS_OPEN, [plain_dumps(request)]


def decode_request(kind: Kind, payload: memoryview) -> Request:
    """Inverse of :func:`encode_request` for the kinds that open a request; copies what
    it keeps out of ``payload``."""
    if kind is Kind.HTTP:
        (request_id, scope, more_body, trace, tracestate), body = _split_body(payload)
        return HTTPRequest(request_id, scope, body, more_body, trace, tracestate)
    request = pickle.loads(payload)
    if not isinstance(request, MethodCall | WebSocketOpen) or (kind is Kind.CALL) != isinstance(
        request, MethodCall
    ):
        raise ValueError(f"a {kind.name} frame carried a {type(request).__name__}")
    return request


def decode_client_message(payload: memoryview) -> WebSocketMessage:
    """A WS_IN frame's message."""
    return WebSocketMessage(pickle.loads(payload))


def decode_body_piece(payload: memoryview) -> Message:
    """A BODY_IN frame, as the ASGI message the app receives."""
    return {"type": "http.request", "body": payload[1:].tobytes(), "more_body": payload[:1] == _MORE}


def encode_answer(answer: Answer, dumps: Dumps) -> Frame:
    """The frame of one answer, as its parts. ``dumps`` serializes user objects (results
    and stream items)."""
    match answer:
        case HTTPResponse():
            return Kind.RESPONSE, _with_body(
                plain_dumps((answer.status, answer.headers, answer.route)), answer.body
            )
        case BodyChunk():
            return Kind.BODY, [bytes(answer.data)]
        case StreamEnd():
            return Kind.END, []
        case CallResult():
            return Kind.RESULT, [dumps(answer.value)]
        case StreamItem():
            return Kind.ITEM, [dumps(answer.value)]
        case WebSocketMessage():
            return Kind.WS_OUT, [plain_dumps(answer.message)]
        case HTTPResponseStart():
            return Kind.START, [plain_dumps(answer)]
        case CallFailure():
            return Kind.FAILURE, [plain_dumps(answer)]
        case Rejected():
            return Kind.REJECTED, [_DRAINING] if answer.draining else []
        case ReplicaLost():
            raise ValueError("ReplicaLost is the caller's own answer; it never goes on the wire")


def decode_answer(kind: Kind, payload: memoryview) -> Answer:
    """Inverse of :func:`encode_answer`; copies what it keeps out of ``payload``."""
    if kind is Kind.RESPONSE:
        (status, headers, route), body = _split_body(payload)
        return HTTPResponse(status, headers, body, route)
    if kind is Kind.BODY:
        return BodyChunk(payload.tobytes())
    if kind is Kind.END:
        return StreamEnd()
    if kind is Kind.RESULT:
        return CallResult(pickle.loads(payload))
    if kind is Kind.ITEM:
        return StreamItem(pickle.loads(payload))
    if kind is Kind.WS_OUT:
        return WebSocketMessage(pickle.loads(payload))
    if kind is Kind.REJECTED:
        return Rejected(draining=bytes(payload) == _DRAINING)
    if kind is Kind.START or kind is Kind.FAILURE:
        answer = pickle.loads(payload)
        if isinstance(answer, HTTPResponseStart | CallFailure):
            return answer
    raise ValueError(f"a {kind.name} frame is not an answer")


def encode_credit(amount: int) -> list[bytes]:
    return [_CREDIT.pack(amount)]


def decode_credit(payload: memoryview) -> int:
    amount: int = _CREDIT.unpack(payload)[0]
    return amount


class FrameProtocol(asyncio.Protocol):
    """Splits the byte stream into frames and hands each to ``on_frame``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.closed = False
        # Frames sent with ``soon`` (requests, replies, stream chunks) wait here until the
        # end of the current event-loop turn, so many made in one turn cost one write.
        self._soon: list[bytes] = []
        self._soon_bytes = 0
        self._last_write = 0.0  # loop time of the last stream-chunk write
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The largest frame this side accepts; a peer announcing more is cut off before
        #: anything of the frame is buffered.
        self.max_receive = MAX_FRAME_BYTES
        self._dropped = False  # closed by this side: whatever still arrives is ignored

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports (Ray's async actors run on uvloop) are not asyncio.Transport
        # subclasses, but have the same interface.
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=_HIGH_WATER)  # type: ignore[attr-defined]
        self._loop = asyncio.get_running_loop()

    def on_frame(self, kind: Kind, number: int, payload: memoryview) -> None:
        raise NotImplementedError

    def on_lost(self) -> None:
        """Called once when the connection closes."""

    def data_received(self, data: bytes) -> None:
        if self._dropped:
            return
        buffer = self._buffer
        buffer += data
        size = len(buffer)
        offset = 0
        oversized = False
        # Frames are handed over as views into the buffer, valid only during on_frame:
        # decoding copies what it keeps, so a large body is copied once, not three times.
        with memoryview(buffer) as view:
            while size - offset >= HEADER.size:
                length, number, kind = HEADER.unpack_from(view, offset)
                if length > self.max_receive:
                    logger.warning(
                        "Closing a data-plane connection that announced a %d-byte frame (limit %d)",
                        length,
                        self.max_receive,
                    )
                    oversized = True
                    break
                end = offset + HEADER.size + length
                if end > size:
                    break
                try:
                    self.on_frame(Kind(kind), number, view[offset + HEADER.size : end])
                except _UNDECODABLE as exc:
                    # The peer's fault (a kind no frame has, a payload that does not
                    # decode): said in a line, not a traceback.
                    error = f"{type(exc).__name__}: {exc}"
                    logger.warning("Dropping a malformed frame (%s); closing the connection", error)
                    self.drop()  # a fresh buffer, and what still arrives is ignored
                    return
                except Exception:
                    logger.exception("Handling a frame failed; closing the connection")
                    self.drop()
                    return
                if self._dropped:
                    return
                offset = end
        if oversized:
            self.drop()
            return
        if offset:
            del buffer[:offset]

    def send(self, kind: Kind, number: int, parts: list[bytes], soon: bool = False) -> None:
        """Write one frame now, or with ``soon`` at the end of this loop turn (frames
        keep their order either way)."""
        if self.closed or self.transport is None:
            return
        length = sum(len(part) for part in parts)
        if length >= MAX_FRAME_BYTES:
            raise ValueError(f"Message of {length} bytes is larger than a frame (2 GiB)")
        header = HEADER.pack(length, number, kind)
        if length >= _SOON_MAX:
            self._flush()
            self.transport.writelines([header, *parts])
            return
        frame = header + b"".join(parts)
        if soon and self._loop is not None:
            # A chunk after a pause goes at once (with any still waiting), so a slow
            # producer, or one that blocks its event loop, streams chunk by chunk; chunks
            # close behind each other wait for the end of the loop turn and leave together.
            self._soon.append(frame)
            self._soon_bytes += len(frame)
            if self._loop.time() - self._last_write >= _SOON_WINDOW_S or self._soon_bytes >= _SOON_MAX:
                self._flush()
            elif len(self._soon) == 1:
                self._loop.call_soon(self._flush)
            return
        if self._soon:
            self._soon.append(frame)
            self._flush()
            return
        self.transport.write(frame)

    def _flush(self) -> None:
        if self._soon and not self.closed and self.transport is not None:
            self.transport.write(b"".join(self._soon))
            if self._loop is not None:
                self._last_write = self._loop.time()
        self._soon.clear()
        self._soon_bytes = 0

    async def drain(self) -> None:
        if self._paused and not self.closed:
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_drainers()

    def _wake_drainers(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake_drainers()
        self.on_lost()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self._flush()
            self.transport.close()

    def drop(self) -> None:
        """Close at once and forget what was received (a peer breaking the rules)."""
        self._dropped = True
        self._buffer = bytearray()
        if self.transport is not None and not self.closed:
            self.transport.abort()
