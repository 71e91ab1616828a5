"""Reading a request body in the proxy, within three bounds: its own size
(``max_request_body_bytes``, 413), the bytes of all bodies the proxy holds at once
(``max_buffered_body_bytes``, 503 with Retry-After) and the longest pause between two of its
pieces (``body_timeout_s``, 408). The proxy reads ahead what has arrived, up to
``READ_AHEAD_BYTES``, and streams the rest to the replica as the client sends it."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from starlette.types import Message, Receive

from app_toolkit._runtime.answers import error_answer, unavailable
from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.front.cycle import CLIENT_CLOSED, HTTPCycle, watch_disconnect
from app_toolkit._runtime.front.request_link import RequestLink
from app_toolkit._runtime.messages import HTTPResponse, RequestBodyPiece
from app_toolkit.config import HTTPOptions

logger = logging.getLogger("app_toolkit.proxy")

#: The most of a body the proxy reads before it forwards the request (of what has
#: arrived already); the rest streams to the replica as it arrives.
READ_AHEAD_BYTES = 64 << 10


class BodyBudget:
    """Bytes of request bodies one proxy holds at once (read, queued or being sent)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size


class BodyReader:
    """A request's body as it comes from the client, within its bounds: the one place
    they are kept, on every path (read before forwarding, pumped to a replica, read by an
    app in its replica). ``max_request_body_bytes`` over the whole body (413) and
    ``body_timeout_s`` between pieces (408); a wait is bounded only when the protocol
    (``link``) does not say the next piece has arrived already."""

    __slots__ = ("_receive", "_link", "_limit", "_timeout_s", "size", "refusal")

    def __init__(self, receive: Receive, http: HTTPOptions, link: RequestLink | None, size: int = 0) -> None:
        self._receive = receive
        self._link = link
        self._limit = http.max_request_body_bytes
        self._timeout_s = http.body_timeout_s
        self.size = size  # bytes of the body read so far
        self.refusal = 0  # 413 or 408 once a bound is broken

    async def next(self) -> Message | None:
        """The client's next message (a piece of the body, or its leaving); None when the
        body broke a bound (``refusal`` says which)."""
        link = self._link
        if link is not None and link.body_ready():  # here already: no wait to bound
            message = await self._receive()
        else:
            try:
                async with asyncio.timeout(self._timeout_s):
                    message = await self._receive()
            except TimeoutError:
                self.refusal = 408
                return None
        if message["type"] == "http.request":
            self.size += len(message.get("body", b""))
            if self.size > self._limit:
                self.refusal = 413
                return None
        return message


def declared_too_large(content_length: bytes | None, http: HTTPOptions) -> bool:
    """The request says its body is larger than ``max_request_body_bytes``: 413 before
    anything of it is read."""
    return (
        content_length is not None
        and content_length.isdigit()
        and int(content_length) > http.max_request_body_bytes
    )


@dataclass(slots=True)
class Body:
    """A request body as read before forwarding: ``data`` (whole, or with ``more`` its
    start), else why not (``refusal``)."""

    data: bytes = b""
    held: int = 0  # bytes taken from the budget; give them back when the request ends
    refusal: int = 0  # 0: read; else 413, 503, 408 or CLIENT_CLOSED
    more: bool = False  # the rest is still with the client: stream it (BodyPump)
    reader: BodyReader | None = None  # what read it (the pump goes on with it)

    def answer(self, http: HTTPOptions, request_id: str) -> HTTPResponse:
        """The answer to a refused body (not for CLIENT_CLOSED: nobody is listening)."""
        return refusal_answer(self.refusal, http, request_id)


def refusal_answer(status: int, http: HTTPOptions, request_id: str) -> HTTPResponse:
    """The answer to a body refused with ``status``: 413 (too large), 503 (too many
    bodies held) or 408 (it stalled)."""
    if status == 413:
        detail = f"Request body larger than {http.max_request_body_bytes} bytes (max_request_body_bytes)"
        return error_answer(413, detail, request_id)
    if status == 503:
        return unavailable("too many request bodies in flight", request_id)
    detail = f"The request body stalled for over {http.body_timeout_s} s (body_timeout_s)"
    return error_answer(408, detail, request_id)


async def read_body(
    receive: Receive,
    content_length: bytes | None,
    http: HTTPOptions,
    budget: BodyBudget,
    link: RequestLink | None = None,
) -> Body:
    """Read what the request is forwarded with: the whole body, or its start (``more``)
    when the rest has not arrived yet or it is over ``READ_AHEAD_BYTES`` — the first piece
    and the pieces that came with it (``link`` says which are here; without one, the
    first alone). Bytes are taken from ``budget`` (up front when a length is declared, as
    far as read-ahead goes, else as they arrive)."""
    reader = BodyReader(receive, http, link)
    body = Body(reader=reader)
    if declared_too_large(content_length, http):
        body.refusal = 413
        return body
    if content_length is not None and content_length.isdigit():
        if not budget.take(min(int(content_length), READ_AHEAD_BYTES)):
            body.refusal = 503
            return body
        body.held = min(int(content_length), READ_AHEAD_BYTES)
    chunks = []
    while True:
        message = await reader.next()
        if message is None:
            body.refusal = reader.refusal
            return body
        if message["type"] == "http.disconnect":
            body.refusal = CLIENT_CLOSED
            return body
        chunk = message.get("body", b"")
        size = reader.size
        if size > body.held:  # more than declared, or no length declared
            if not budget.take(size - body.held):
                body.refusal = 503
                return body
            body.held = size
        chunks.append(chunk)
        body.more = message.get("more_body", False)
        if not body.more or size >= READ_AHEAD_BYTES or link is None or not link.body_ready():
            body.data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            return body


class BodyPump:
    """The rest of a body that :func:`read_body` read the start of, sent to the replica
    that admits the request as the client sends it (at most a flow-control window ahead
    of the app), within the same bounds: ``max_request_body_bytes`` (413) and
    ``body_timeout_s`` between pieces (408), answered in the app's place. Under a server
    without our protocol's link it also hears the client leave once the body is sent
    (nothing else may call ``receive()`` meanwhile).

    Use as ``async with``: the pumps it started end with the block."""

    def __init__(self, receive: Receive, read: Body, http: HTTPOptions, state: HTTPCycle) -> None:
        self._receive = receive
        self._reader = read.reader or BodyReader(receive, http, state.link, len(read.data))
        self._http = http
        self._state = state
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> BodyPump:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        # gather, not a suppressed await: a cancellation of this request itself (a deadline,
        # the client leaving) must still reach it.
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(outcome, Exception):
                logger.error("Streaming a request body failed", exc_info=outcome)

    def start(self, exchange: Exchange) -> None:
        """Pump into ``exchange`` once its replica admits the request (given to the
        dispatcher: a replica that refuses it gets nothing, and the next one the body
        whole)."""
        task = asyncio.get_running_loop().create_task(self._pump(exchange))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _pump(self, exchange: Exchange) -> None:
        await exchange.room_to_send()  # the first credit: the replica admitted the request
        if exchange.finished:
            return  # refused (or lost): nothing was read
        state = self._state
        # Cancelled meanwhile, it stays set: a deadline that passes now is the upload's (408).
        state.uploading = True
        sent = await self._send_rest(exchange)
        state.uploading = False
        if sent and state.link is None:
            await watch_disconnect(self._receive, state)

    async def _send_rest(self, exchange: Exchange) -> bool:
        """Send the client's pieces until the last; False if the body ended otherwise
        (refused here, the client left, the app answered without it)."""
        state, reader = self._state, self._reader
        while True:
            message = await reader.next()
            if message is None:
                exchange.refuse(refusal_answer(reader.refusal, self._http, state.request_id))
                return False
            if message["type"] == "http.disconnect":
                if state.link is None:  # else our protocol tells the request itself
                    state.client_left()
                return False
            chunk = message.get("body", b"")
            more = bool(message.get("more_body", False))
            exchange.send(RequestBodyPiece(chunk, more))
            if not more:
                return True
            await exchange.room_to_send()
            if exchange.finished:
                return False  # the app answered without the rest of the body
