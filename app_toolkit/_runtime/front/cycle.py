"""One HTTP request from its head to its last byte, as the front serves it: its responder
(Starlette's sense; uvicorn's ``RequestResponseCycle`` plays this part for uvicorn).

An :class:`HTTPCycle` is made once per request from its scope, ``receive``, ``send``, the
application route it matched and the front's rules. :meth:`HTTPCycle.run` is the
request's one control flow: the deadline (400 for a bad one; 408 while the body still
arrives, else 504), a body declared too large (413 before any upstream runs), the client
leaving (499), a body refused on its reader (answered while no head went out; a response
it cut short is aborted), and the record closed once at the end (access line, metrics,
span). What runs in between is an ``Upstream`` (``upstream.py``): over the channel, or
in this replica. The cycle owns the request's one body reader (``body.py``) and writes
every response: the app's relayed from a replica, the app's own in its replica, and the
toolkit's answers (``/-/dashboard`` writes its own page and stream).

Writing: the request id goes into the head; a whole response leaves in one write where
the link lets it; a stream's chunks leave as they come (those that came together in one
write), counted (open streams, time to the first chunk, chunks).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from starlette.types import Message, Receive, Scope, Send

from app_toolkit._runtime import request_context, tracing
from app_toolkit._runtime.answers import closing, error_answer
from app_toolkit._runtime.front import stream_metrics
from app_toolkit._runtime.front.access_log import AccessLog
from app_toolkit._runtime.front.body import CLIENT_CLOSED, BodyReader, declared_too_large, refusal_answer
from app_toolkit._runtime.front.path_match import AppMatcher
from app_toolkit._runtime.front.request_link import REQUEST_LINK, RequestLink
from app_toolkit._runtime.front.request_metrics import HTTP_DURATION
from app_toolkit._runtime.front.scope import read_headers, request_deadline, with_request_id
from app_toolkit._runtime.messages import DeploymentID, HTTPResponse
from app_toolkit.config import HTTPOptions

logger = logging.getLogger("app_toolkit.proxy")


@dataclass(frozen=True, slots=True)
class FrontRules:
    """What every request of one front is served by: its options, the shard key header
    (lowercased bytes) and its access log (None: off)."""

    http: HTTPOptions
    shard_header: bytes
    access_log: AccessLog | None


class Responder(Protocol):
    """What serves a request once its cycle runs: an ``Upstream``, or the toolkit's pages."""

    def http(self, cycle: HTTPCycle) -> Awaitable[None]:
        """Serve one request; its answer goes to the client through ``cycle``."""
        ...


class HTTPCycle:
    """One request while the front serves it, and what its record says once it is done."""

    __slots__ = (
        "scope",
        "path",
        "_receive",
        "_send",
        "link",
        "task",
        "arrived",
        "http",
        "_access_log",
        "headers",
        "request_id",
        "reader",
        "matched",
        "deployment",
        "_deadline_s",
        "keyless",
        "app",
        "prefix",
        "target",
        "status",
        "started",
        "finished",
        "disconnected",
        "_stopped",
        "route",
        "logged",
        "span",
        "_labels",
        "_first",
    )

    def __init__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        rules: FrontRules,
        matched: AppMatcher | None,
        path: str,
    ) -> None:
        self.scope = scope
        self.path = path  # what routes match: without the server's root_path
        self._receive = receive
        self._send = send
        self.link: RequestLink = scope[REQUEST_LINK]  # every server of the front gives one
        self.task = cast("asyncio.Task[Any]", asyncio.current_task())
        self.arrived = time.perf_counter()
        self.http = rules.http
        self._access_log = rules.access_log
        self.headers = headers = read_headers(scope, rules.shard_header)
        self.request_id = headers.request_id
        if (handed := self.link.handed) is not None:  # noted first: a 502's, should the replica die
            handed.table.set_request_id(handed.slot, self.request_id)
        self.reader = BodyReader(receive, rules.http, self.link)
        self.matched = matched  # the application it goes to (None: a toolkit page, or a refusal)
        self.app = ""  # the application it went to
        self.prefix = ""  # that app's route_prefix, "" for "/"
        self.target = ""  # what it was sent to (an app's prefix, a /-/ page) until ``route`` is known
        self.logged = True  # it gets an access line (its application's enable_access_log)
        self.deployment: DeploymentID | None = None
        self._deadline_s: float | None = None
        self.keyless = False  # its route is served without an API key (``@open_route``)
        if matched is not None:
            self.deployment, self._deadline_s, self.keyless = matched.target("http", scope["method"], path)
            self.app, self.target, self.logged = matched.app, matched.route_prefix, matched.access_log
            self.prefix = "" if matched.route_prefix == "/" else matched.route_prefix
        self.status = 500  # the status sent to the client (499: it left), unless one was sent
        self.started = False  # the response head went to the client
        # Nothing more of the response is ours to write: its last piece was handed to ``send``
        # (set before that write, so it may still be under way), it was aborted, or the upstream
        # is done (returned, timed out or stopped). From then on a client leaving or a refused
        # body stops nothing.
        self.finished = False
        self.disconnected = False
        self._stopped = False  # cancelled by the cycle itself (the client left, the body refused)
        self.route = ""  # the path template the replica's app matched
        self.span: tracing.Span | None = None  # the front's exported span, if spans are made
        self._labels: tuple[str, str] | None = None  # set while a stream is open
        self._first = True

    @property
    def app_receive(self) -> Receive:
        """The ``receive`` an app in this process reads: the body within its bounds."""
        return self.reader.receive if self.headers.has_body else self._receive

    @property
    def span_trace(self) -> tracing.TraceContext | None:
        """The front's exported span, as the replica's span continues it."""
        return self.span.trace if self.span is not None else None

    # --------------------------------------------------------------------- the control flow

    async def run(self, upstream: Responder) -> None:
        """Serve the request through ``upstream`` under every rule above; close its record."""
        try:
            if self.matched is None:
                await upstream.http(self)  # a toolkit page: no deadline, no body read
            else:
                await self._to_app(upstream)
        finally:
            self._close()

    async def refuse(self, answer: HTTPResponse) -> None:
        """Answer ``answer`` before anything else of the request is looked at (no valid
        API key: no deadline, body or app), and close its record."""
        try:
            await self.answer(answer)
        finally:
            self._close()

    async def _to_app(self, upstream: Responder) -> None:
        assert self.matched is not None  # (run sends the toolkit's pages elsewhere)
        timeout_s = request_deadline(self.headers.timeout, self._deadline_s, self.http.request_timeout_s)
        if isinstance(timeout_s, str):
            await self.answer(error_answer(400, timeout_s, self.request_id))
            return
        if tracing.exporting():  # an exported span: the replica's continues it
            name = f"{self.scope['method']} {self.matched.route_prefix}"
            self.span = tracing.start(name, "server", self.headers.caller)
        if declared_too_large(self.headers.content_length, self.http):
            await self.answer(refusal_answer(413, self.http, self.request_id))
            return
        link, task = self.link, self.task
        link.on_client_left = self._client_left
        cancelling = task.cancelling()  # cancellations asked of it from elsewhere, before
        try:
            if timeout_s is None:
                await upstream.http(self)
            else:  # it covers the upload too (a slow one gets 408, not a replica's time)
                async with asyncio.timeout(timeout_s):
                    await upstream.http(self)
        except asyncio.CancelledError:
            # Ours (the client left, the body was refused) is handled here; one asked
            # from elsewhere too (the server stopping) goes on up.
            if not self._stopped or task.uncancel() > cancelling:
                raise
        except TimeoutError:
            await self._deadline_passed(timeout_s)
        finally:
            link.on_client_left = None
        if self.disconnected or self.reader.refusal:
            await self._body_ended()
        self.finished = True

    async def _body_ended(self) -> None:
        """The upstream is done, or was stopped: what a refused body or a client that left
        makes of the request."""
        refusal = self.reader.refusal
        if self.disconnected or (refusal == CLIENT_CLOSED and not self.finished):
            self.status = CLIENT_CLOSED
        elif not refusal:
            return
        elif not self.started:
            logger.info("Request %s: body refused (%d)", self.request_id, refusal)
            await self.answer(refusal_answer(refusal, self.http, self.request_id))
        elif not self.finished:
            await self.abort("the request body was refused")

    async def _deadline_passed(self, timeout_s: float | None) -> None:
        """408 while the body was still arriving, else 504 if no head went out yet."""
        with request_context.request_scope(self.request_id):  # for these log records
            if not self.started and self.link.body_arriving():
                logger.info(
                    "Request %s: the upload outlasted the deadline of %s s (408)", self.request_id, timeout_s
                )
                detail = f"Request Timeout: the body did not arrive within the deadline of {timeout_s} s"
                await self.answer(closing(error_answer(408, detail, self.request_id)))
                return
            logger.info("Request %s: deadline of %s s passed (504)", self.request_id, timeout_s)
            if not self.started:
                detail = f"Gateway Timeout: the request took longer than {timeout_s} s"
                await self.answer(error_answer(504, detail, self.request_id))

    def _client_left(self) -> None:
        """The link says the client went away: cancel the request wherever it is."""
        if not self.finished:
            self.disconnected = True
            self._stop()

    def stop_for_body(self) -> None:
        """The body was refused while it was pumped: stop the request (run answers it)."""
        if not self.finished:
            self._stop()

    def _stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self.task.cancel()

    # ----------------------------------------------------------------------------- writing

    def served_page(self, target: str, status: int | None = None) -> None:
        """A toolkit page answers: ``target`` labels its record (``status``: one it wrote)."""
        self.target = target
        if status is not None:
            self.status = status

    def routed(self, template: str) -> None:
        """The app's routing matched ``template`` (what the record is labelled with)."""
        self.route = template

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
        link.join_head_and_body()
        try:
            await self._send(head)
            await self._send({"type": "http.response.body", "body": body})
        finally:
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
        link.gather_writes()
        try:
            await self._send(head)
            await self._send({"type": "http.response.body", "body": first, "more_body": True})
        finally:
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
        gather = last or len(pieces) > 1
        if gather:
            self.link.gather_writes()
        try:
            final = len(pieces) - 1
            for index, piece in enumerate(pieces):
                more = not (last and index == final)
                await self._send({"type": "http.response.body", "body": piece, "more_body": more})
        finally:
            if gather:
                self.link.release()
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
        logger.debug("Request %s: %s after the response started", self.request_id, why)
        self.finished = True
        self.stream_closed()
        self.link.abort()
        await asyncio.sleep(0)  # the protocol hears the connection end: no "incomplete" error

    # -------------------------------------------------------------------------- its record

    def _close(self) -> None:
        """The request ended: its metrics, access line and span, once."""
        scope = self.scope
        # Its route for metrics and the access line: the app's prefix and the template its
        # app matched, else what it was sent to (never the raw path).
        label = self.prefix + self.route if self.route else self.target
        took = time.perf_counter() - self.arrived
        HTTP_DURATION.observe(took, self.app, label, scope["method"], str(self.status))  # and HTTP_REQUESTS
        if self._access_log is not None and self.logged:
            self._access_log.add(scope, self.status, took, self.request_id, self.app, label)
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


def _head(
    status: int, headers: Iterable[tuple[bytes, bytes]], request_id: str, start: Message | None
) -> Message:
    head = {
        "type": "http.response.start",
        "status": status,
        "headers": with_request_id(headers, request_id),
    }
    return head if start is None else {**start, **head}
