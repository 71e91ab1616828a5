"""One HTTP request from its head to its last byte, as the front serves it: the one owner
of what happens to it (uvicorn's ``RequestResponseCycle`` plays this part for uvicorn).

An :class:`HTTPCycle` writes every response of a request to an application or of a
toolkit page answered in one piece — the app's response relayed from a replica
(``forward.py``), the app's own in its replica (``backends/ray/direct.py``) and the toolkit's answers
(404, 408, 413, 503, 504, ...) alike; ``/-/dashboard`` writes its own page and event
stream —, decides when a client that went away makes the request a 499 (:meth:`left`;
one that leaves before sending its body is marked so where the body is read), and closes
the request's record (its access line, metrics and span), once, at its end.

Writing: the request id goes into the head; a whole response's head and body leave in
one write where our HTTP protocol lets them; a stream's chunks leave as they come, those
that came together in one write (each still its own chunk); a stream is counted (open
streams, time to its first chunk, chunks).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from app_toolkit import metrics
from app_toolkit._runtime import tracing
from app_toolkit._runtime.front import stream_metrics
from app_toolkit._runtime.front.access_log import AccessLog
from app_toolkit._runtime.front.path_match import AppMatcher
from app_toolkit._runtime.front.request_link import RequestLink
from app_toolkit._runtime.front.scope import RequestHeaders, with_request_id
from app_toolkit._runtime.messages import HTTPResponse

#: nginx's status for "the client closed the connection": it went away first.
CLIENT_CLOSED = 499


class HTTPCycle:
    """One request while the front serves it, and what its record says once it is done."""

    __slots__ = (
        "_send",
        "task",
        "arrived",
        "request_id",
        "app",
        "prefix",
        "target",
        "started",
        "finished",
        "disconnected",
        "status",
        "route",
        "link",
        "uploading",
        "logged",
        "span",
        "headers",
        "matched",
        "_labels",
        "_first",
    )

    def __init__(self, send: Send, task: asyncio.Task[Any] | None, arrived: float) -> None:
        self._send = send
        self.task = task
        self.arrived = arrived  # perf_counter() when the request reached the front
        self.request_id = "-"
        self.app = ""  # the application it went to
        self.prefix = ""  # that app's route_prefix, "" for "/"
        self.target = ""  # what it was sent to (an app's prefix, a /-/ page) until ``route`` is known
        self.status = 500  # the status sent to the client (499: it left), unless one was sent
        self.started = False  # the response head went to the client
        self.finished = False  # the whole response went to the client
        self.disconnected = False
        self.route = ""  # the path template the replica's app matched
        self.link: RequestLink | None = None  # what our HTTP protocol offers beyond ASGI
        #: Under a server without our protocol's link: the front is still reading the body
        #: from the client (``read_body``, the body's pump; see :meth:`body_arriving`).
        self.uploading = False
        self.logged = True  # it gets an access line (its application's enable_access_log)
        self.span: tracing.Span | None = None  # the front's exported span, if spans are made
        self.headers: RequestHeaders | None = None  # what the front read from its headers
        self.matched: AppMatcher | None = None  # the application it goes to
        self._labels: tuple[str, str] | None = None  # set while a stream is open
        self._first = True

    def to_app(self, matched: AppMatcher) -> None:
        """The request goes to ``matched``'s application."""
        self.matched = matched
        self.app, self.target, self.logged = matched.app, matched.route_prefix, matched.access_log
        self.prefix = "" if matched.route_prefix == "/" else matched.route_prefix

    def body_arriving(self) -> bool:
        """The request's body was still arriving: a deadline that passed is the upload's
        (408), not the app's (504). Our protocol knows (:class:`RequestLink`); under
        another server, the front's own reads of the body say it (``uploading``)."""
        return self.link.body_arriving() if self.link is not None else self.uploading

    # ------------------------------------------------------------------ the client leaving

    def client_left(self) -> None:
        """The client went away: cancel the request wherever it is (servers also report a
        "disconnect" once the response is complete; that is not a client going away)."""
        if not self.finished and self.task is not None:
            self.disconnected = True
            self.task.cancel()

    def left(self) -> bool:
        """In an ``except CancelledError`` around a request: True if the cancellation is
        the one :meth:`client_left` asked for, now handled (the request's status is 499);
        False if it came from elsewhere (re-raise it)."""
        if not self.disconnected:
            return False
        if self.task is not None:
            self.task.uncancel()
        self.status = CLIENT_CLOSED
        return True

    # ----------------------------------------------------------------------------- writing

    async def answer(self, response: HTTPResponse) -> None:
        """A toolkit's answer (or a replica's whole one) as the response."""
        await self.whole(response.status, response.headers, response.body, self.route)

    async def whole(
        self,
        status: int,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes,
        route: str,
        start: Message | None = None,
    ) -> None:
        """A complete response: its head and body in one write. ``start``: the app's own
        ``http.response.start``, whose other keys (``trailers``) are kept."""
        self.route = route
        self.started = self.finished = True
        self.status = status
        head = _head(status, headers, self.request_id, start)
        link = self.link
        if link is not None:
            link.join_head_and_body()
        try:
            await self._send(head)
            await self._send({"type": "http.response.body", "body": body})
        finally:
            if link is not None:
                link.release()

    async def stream(
        self,
        status: int,
        headers: Iterable[tuple[bytes, bytes]],
        route: str,
        first: bytes | None = None,
        start: Message | None = None,
    ) -> None:
        """A streamed response's head, with its first chunk if that is here (one write);
        ``start`` as for :meth:`whole`."""
        self.route = route
        self.started = True
        self.status = status
        head = _head(status, headers, self.request_id, start)
        self._labels = (self.app, self.prefix + route if route else self.prefix)
        stream_metrics.OPEN.inc(self.app, "stream")
        if first is None:
            await self._send(head)
            return
        link = self.link
        if link is not None:
            link.gather_writes()
        try:
            await self._send(head)
            await self._send({"type": "http.response.body", "body": first, "more_body": True})
        finally:
            if link is not None:
                link.release()
        self._counted(1 if first else 0)

    async def chunk(self, piece: bytes) -> None:
        """The stream's next piece, not its last (most of a stream: written as it comes,
        with less to do than :meth:`chunks`)."""
        await self._send({"type": "http.response.body", "body": piece, "more_body": True})
        self._counted(1 if piece else 0)

    async def chunks(self, pieces: Sequence[bytes], last: bool) -> None:
        """Pieces of the stream's body that are here, in one write; ``last``: the final one
        is among them (the response is then complete)."""
        self.finished = last
        # Gathered, and the last pieces even alone: our protocol writes them when the
        # response is complete, knowing they end it (http_guard.py, on_response_complete).
        link = self.link if last or len(pieces) > 1 else None
        if link is not None:
            link.gather_writes()
        try:
            final = len(pieces) - 1
            for index, piece in enumerate(pieces):
                more = not (last and index == final)
                await self._send({"type": "http.response.body", "body": piece, "more_body": more})
        finally:
            if link is not None:
                link.release()
        self._counted(len(pieces) - pieces.count(b""))  # empty pieces are no chunks
        if last:
            self.stream_closed()

    async def send_other(self, message: Message) -> None:
        """An app's message of an ASGI extension: the server's to judge."""
        await self._send(message)

    def _counted(self, sent: int) -> None:
        """``sent`` chunks of the stream went out."""
        labels = self._labels
        if labels is None or not sent:
            return
        if self._first:
            self._first = False
            stream_metrics.FIRST_CHUNK.observe(time.perf_counter() - self.arrived, *labels)
        stream_metrics.CHUNKS.inc(*labels, amount=sent)

    def stream_closed(self) -> None:
        """The stream ended (or failed): it is no longer open."""
        if self._labels is not None:
            stream_metrics.OPEN.dec(self.app, "stream")
            self._labels = None

    async def abort(self, why: str) -> None:
        """End the client's connection without completing the response (it failed after
        its head went out): the client must not take what it got for a whole response."""
        self.finished = True
        self.stream_closed()
        if self.link is None:  # under another server: raising is how a response is cut off
            raise ResponseAborted(f"{why} after the response started")
        self.link.abort()
        await asyncio.sleep(0)  # the protocol hears the connection end: no "incomplete" error

    # -------------------------------------------------------------------------- its record

    def close(self, scope: Scope, access_log: AccessLog | None) -> None:
        """The request ended: its metrics, access line and span, once."""
        # Its route for metrics and the access line: the app's prefix and the template its
        # app matched, else what it was sent to (never the raw path).
        label = self.prefix + self.route if self.route else self.target
        took = time.perf_counter() - self.arrived
        HTTP_DURATION.observe(took, self.app, label, scope["method"], str(self.status))  # and HTTP_REQUESTS
        if access_log is not None and self.logged:
            access_log.add(scope, self.status, took, self.request_id, self.app, label)
        span = self.span
        if span is not None:
            self.span = None
            if self.route:
                span.rename(f"{scope['method']} {label}")
                span.set("http.route", label)
            span.set("http.request.method", scope["method"])
            span.set("http.response.status_code", self.status)
            span.set("app_toolkit.application", self.app)
            span.end(f"HTTP {self.status}" if self.status >= 500 else "")


class ResponseAborted(Exception):
    """Raised to a foreign ASGI server to make it cut a started response off."""


async def watch_disconnect(receive: Receive, cycle: HTTPCycle) -> None:
    """Under a server without our protocol's :class:`RequestLink`: wait on ``receive()``
    for the ``http.disconnect`` message."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
    cycle.client_left()


def _head(
    status: int, headers: Iterable[tuple[bytes, bytes]], request_id: str, start: Message | None
) -> Message:
    head = {
        "type": "http.response.start",
        "status": status,
        "headers": with_request_id(headers, request_id),
    }
    return head if start is None else {**start, **head}


HTTP_DURATION = metrics.Histogram(
    "app_toolkit_http_request_duration_seconds",
    "From the request's arrival at the proxy to the end of its response",
    ("application", "route", "method", "status"),
)
#: Read from HTTP_DURATION: a request timed there is a request answered.
HTTP_REQUESTS = metrics.Counter(
    "app_toolkit_http_requests_total",
    "HTTP requests the proxy answered",
    ("application", "route", "method", "status"),
    counts=HTTP_DURATION,
)
