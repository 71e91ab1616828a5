"""Reading a request body in the front, within three bounds: its own size
(``max_request_body_bytes``, 413), the bytes of all bodies the proxy holds at once
(``max_buffered_body_bytes``, 503 with Retry-After) and the longest pause between two of its
pieces (``body_timeout_s``, 408). Over the channel, the front reads ahead what has
arrived, up to ``READ_AHEAD_BYTES``, and pumps the rest to the replica as the client
sends it; in an ingress replica's own process the app reads it through the same reader.
A body that breaks a bound is refused on its request's :class:`BodyReader`; the request's
cycle answers the refusal (``cycle.py``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import Message, Receive

from app_toolkit._runtime.answers import closing, error_answer, unavailable
from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.front.request_link import RequestLink
from app_toolkit._runtime.messages import HTTPResponse, RequestBodyPiece
from app_toolkit.config import HTTPOptions

logger = logging.getLogger("app_toolkit.proxy")

#: The most of a body the proxy reads before it forwards the request (of what has
#: arrived already); the rest streams to the replica as it arrives.
READ_AHEAD_BYTES = 64 << 10
#: nginx's status for "the client closed the connection": it went away first.
CLIENT_CLOSED = 499
_DISCONNECT: Message = {"type": "http.disconnect"}


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
    """A request's body as it comes from the client, within its bounds: the one reader
    of it, on every path (read ahead and pumped to a replica, or read by an app in its
    replica). ``max_request_body_bytes`` over the whole body (413) and ``body_timeout_s``
    between pieces (408); a wait is bounded only when the link does not say the next
    piece has arrived already. A bound broken, or the client gone before the body's end
    (499), is recorded in ``refusal``; the app then reads a disconnect."""

    __slots__ = ("_receive", "_link", "_limit", "_timeout_s", "size", "refusal", "done")

    def __init__(self, receive: Receive, http: HTTPOptions, link: RequestLink) -> None:
        self._receive = receive
        self._link = link
        self._limit = http.max_request_body_bytes
        self._timeout_s = http.body_timeout_s
        self.size = 0  # bytes of the body read so far
        self.refusal = 0  # 413, 408 or CLIENT_CLOSED once the body ended that way
        self.done = False  # its last piece was read

    async def next(self) -> Message | None:
        """The body's next piece; None when it was refused (``refusal`` says why)."""
        if self.refusal:
            return None
        if self._link.body_ready():  # here already: no wait to bound
            message = await self._receive()
        else:
            try:
                async with asyncio.timeout(self._timeout_s):
                    message = await self._receive()
            except TimeoutError:
                self.refusal = 408
                return None
        if message["type"] != "http.request":
            self.refusal = CLIENT_CLOSED
            return None
        self.size += len(message.get("body", b""))
        if self.size > self._limit:
            self.refusal = 413
            return None
        self.done = not message.get("more_body", False)
        return message

    async def receive(self) -> Message:
        """The app's ``receive``: the body's pieces, a disconnect once it was refused, and
        after its end what the server says (the client leaving, for as long as it takes)."""
        if self.done:
            return await self._receive()
        message = await self.next()
        return _DISCONNECT if message is None else message


def declared_too_large(content_length: bytes | None, http: HTTPOptions) -> bool:
    """The request says its body is larger than ``max_request_body_bytes``: 413 before
    anything of it is read."""
    return (
        content_length is not None
        and content_length.isdigit()
        and int(content_length) > http.max_request_body_bytes
    )


def refusal_answer(status: int, http: HTTPOptions, request_id: str) -> HTTPResponse:
    """The answer to a body refused with ``status``: 413 (too large), 503 (too many
    bodies held) or 408 (it stalled). The connection ends after it, lingering while the
    rest of the body arrives (front/linger.py), instead of reading all of it."""
    if status == 413:
        detail = f"Request body larger than {http.max_request_body_bytes} bytes (max_request_body_bytes)"
        return closing(error_answer(413, detail, request_id))
    if status == 503:
        return closing(unavailable("too many request bodies in flight", request_id))
    detail = f"The request body stalled for over {http.body_timeout_s} s (body_timeout_s)"
    return closing(error_answer(408, detail, request_id))


@dataclass(slots=True)
class Body:
    """A request body as read before forwarding: ``data`` (whole, or with ``more`` its
    start), and the bytes it holds of the proxy's budget (given back when the request
    ends, whatever ended it)."""

    data: bytes = b""
    held: int = 0
    more: bool = False  # the rest is still with the client: pump it (BodyPump)


async def read_ahead(
    body: Body, reader: BodyReader, link: RequestLink, content_length: bytes | None, budget: BodyBudget
) -> bool:
    """Read into ``body`` what the request is forwarded with: the whole body, or its start
    (``more``) when the rest has not arrived yet or it is over ``READ_AHEAD_BYTES`` — the
    first piece and the pieces that came with it. Bytes are taken from ``budget`` (up
    front when a length is declared, as far as read-ahead goes, else as they arrive).
    False: refused (on ``reader``; 503 when the budget is spent)."""
    if content_length is not None and content_length.isdigit():
        if not budget.take(min(int(content_length), READ_AHEAD_BYTES)):
            reader.refusal = 503
            return False
        body.held = min(int(content_length), READ_AHEAD_BYTES)
    chunks = []
    while True:
        message = await reader.next()
        if message is None:
            return False
        size = reader.size
        if size > body.held:  # more than declared, or no length declared
            if not budget.take(size - body.held):
                reader.refusal = 503
                return False
            body.held = size
        chunks.append(message.get("body", b""))
        body.more = not reader.done
        if reader.done or size >= READ_AHEAD_BYTES or not link.body_ready():
            body.data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            return True


class BodyPump:
    """The rest of a body :func:`read_ahead` read the start of, sent to the replica that
    admits the request as the client sends it (at most a flow-control window ahead of the
    app), through the request's reader. A refusal meanwhile stops the request (``stop``:
    its cycle's, which answers the refusal in the app's place).

    Use as ``async with``: the pumps it started end with the block."""

    def __init__(self, reader: BodyReader, stop: Callable[[], None]) -> None:
        self._reader = reader
        self._stop = stop
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
        reader = self._reader
        while not exchange.finished:  # else refused, lost, or answered without the rest
            message = await reader.next()
            if message is None:  # refused, or the client left: the request stops
                self._stop()
                return
            exchange.send(RequestBodyPiece(message.get("body", b""), not reader.done))
            if reader.done:
                return
            await exchange.room_to_send()
