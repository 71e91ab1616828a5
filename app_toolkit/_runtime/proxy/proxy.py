"""The HTTP proxy: an ASGI app that routes each request to an application's ingress.

Longest ``route_prefix`` wins; an unknown path is 404. The proxy honours or creates
``x-request-id`` and returns it. Overload is 503 with ``Retry-After``; a replica lost
mid-request is 503 too. The path is kept whole and the prefix becomes ``root_path``, so
the app's own routes, ``/docs`` and ``/openapi.json`` work under its prefix.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from starlette.types import Receive, Scope, Send

from app_toolkit._runtime.answers import Answer, error_answer, json_answer, unavailable
from app_toolkit._runtime.channel.frames import Kind
from app_toolkit._runtime.messages import DeploymentID, HTTPRequest, HTTPResponse, HTTPResponseStart
from app_toolkit._runtime.proxy.path_match import AppMatcher, match_app
from app_toolkit._runtime.proxy.scope import (
    forwarded_scope,
    parse_timeout,
    read_headers,
    route_path,
    with_request_id,
)
from app_toolkit._runtime.proxy.websocket import serve_websocket
from app_toolkit._runtime.routing.subscriber import TableSubscriber
from app_toolkit._runtime.tables import APPLICATIONS_KEY, ApplicationTable, Table
from app_toolkit.config import HTTPOptions
from app_toolkit.exceptions import BackPressureError, ReplicaUnavailableError

logger = logging.getLogger("app_toolkit.proxy")
access_logger = logging.getLogger("app_toolkit.access")

CLIENT_CLOSED = 499  # nginx's status for "the client closed the connection"


class Proxy:
    """The ASGI application the proxy's uvicorn serves."""

    def __init__(self, subscriber: TableSubscriber, http: HTTPOptions) -> None:
        self.subscriber = subscriber
        self.max_body_bytes = http.max_request_body_bytes
        self.access_log = http.access_log
        self.apps: list[AppMatcher] = []  # longest route_prefix first
        self.ready = subscriber.watch(APPLICATIONS_KEY, self._set_apps)

    def _set_apps(self, table: Table | None) -> None:
        routes = [
            AppMatcher(info) for info in (table.applications if isinstance(table, ApplicationTable) else ())
        ]
        routes.sort(key=lambda route: len(route.route_prefix), reverse=True)
        self.apps = routes
        for route in routes:
            for deployment in route.deployments:
                self.subscriber.dispatcher(deployment)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if not self.access_log:
                await self._http(scope, receive, send)
                return
            started = time.perf_counter()
            status = 500  # unless _http returns normally
            try:
                status = await self._http(scope, receive, send)
            finally:
                _log_access(scope, status, started)
        elif kind == "websocket":
            await serve_websocket(self.apps, self.subscriber.dispatcher, scope, receive, send)
        elif kind == "lifespan":
            await _lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> int:
        """Serve one request; returns the status for the access log (499: client left)."""
        path = route_path(scope)
        headers = read_headers(scope)
        request_id = headers.request_id
        if path.startswith("/-/"):
            return await self._builtin(path, request_id, send)
        route = match_app(self.apps, path)
        if route is None:
            return await _answer(send, error_answer(404, "Not Found", request_id))
        body = await _read_body(receive, headers.content_length, self.max_body_bytes)
        if body is None:
            return CLIENT_CLOSED  # the client went away before sending its body
        if body is _TOO_LARGE:
            return await _answer(
                send,
                error_answer(
                    413,
                    f"Request body larger than {self.max_body_bytes} bytes (max_request_body_bytes)",
                    request_id,
                ),
            )
        forwarded = forwarded_scope(scope, route, headers)
        timeout_s = parse_timeout(headers.timeout)
        if isinstance(timeout_s, str):
            return await _answer(send, error_answer(400, timeout_s, request_id))
        deployment, deadline_s = route.target("http", scope["method"], path)
        if deadline_s is not None and (timeout_s is None or deadline_s < timeout_s):
            timeout_s = deadline_s
        # Watch for the client going away: the request is then cancelled wherever it is
        # (dropped from the queue, or cancelled on the replica).
        state = _RequestState(asyncio.current_task())
        watcher = asyncio.ensure_future(_watch_disconnect(receive, state))
        try:
            async with asyncio.timeout(timeout_s):
                request = HTTPRequest(request_id, forwarded, body)
                await self._forward(deployment, request, send, state, headers.model_id)
        except asyncio.CancelledError:
            if not state.disconnected:
                raise
            if state.task is not None:
                state.task.uncancel()  # we asked for this cancellation; it is handled
            state.status = CLIENT_CLOSED
        except TimeoutError:
            logger.info("Request %s: deadline of %s s passed (504)", request_id, timeout_s)
            if not state.started:
                state.status = await _answer(
                    send,
                    error_answer(
                        504, f"Gateway Timeout: the request took longer than {timeout_s} s", request_id
                    ),
                )
        finally:
            state.finished = True
            watcher.cancel()
        return state.status

    async def _forward(
        self,
        deployment: DeploymentID,
        request: HTTPRequest,
        send: Send,
        state: _RequestState,
        model_id: str = "",
    ) -> None:
        request_id = request.request_id
        dispatcher = self.subscriber.dispatcher(deployment)
        try:
            reply = await dispatcher.send(Kind.HTTP, request, model_id)
        except BackPressureError:
            state.status = await _answer(send, unavailable("too many requests queued", request_id))
            return
        except ReplicaUnavailableError as exc:
            logger.warning("Request %s: %s", request_id, exc)
            state.status = await _answer(send, unavailable("no replica could serve the request", request_id))
            return
        try:
            if reply.kind is Kind.RESPONSE:
                response: HTTPResponse = reply.message
                state.started = state.finished = True
                state.status = response.status
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status,
                        "headers": with_request_id(response.headers, request_id),
                    }
                )
                await send({"type": "http.response.body", "body": response.body})
                return
            start: HTTPResponseStart = reply.message
            state.started = True
            state.status = start.status
            await send(
                {
                    "type": "http.response.start",
                    "status": start.status,
                    "headers": with_request_id(start.headers, request_id),
                }
            )
            exchange = reply.exchange
            while True:
                frame_kind, chunk = await exchange.recv()
                if frame_kind is Kind.BODY:
                    # Chunks that arrived together leave together: one write to the client.
                    more = exchange.take_ready(Kind.BODY)
                    if more:
                        chunk = b"".join([chunk, *more])
                    last = exchange.next_is(Kind.END)
                    state.finished = last
                    await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                    if last:
                        return
                    continue
                if frame_kind is Kind.LOST:
                    logger.warning("Request %s: replica lost mid-stream", request_id)
                    raise ReplicaUnavailableError("replica lost mid-stream")
                state.finished = True
                await send({"type": "http.response.body", "body": b""})
                return
        finally:
            reply.exchange.cancel()
            reply.release()

    async def _builtin(self, path: str, request_id: str, send: Send) -> int:
        if path == "/-/healthz":
            return await _answer(send, json_answer(200, {"status": "ok"}, request_id))
        if path == "/-/routes":
            return await _answer(
                send, json_answer(200, {r.route_prefix: r.app for r in self.apps}, request_id)
            )
        return await _answer(send, error_answer(404, "Not Found", request_id))


class _RequestState:
    """What the proxy knows about one request while it is forwarded."""

    __slots__ = ("task", "started", "finished", "disconnected", "status")

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self.task = task
        self.status = 0  # the status sent to the client, for the access log
        self.started = False  # the response head went to the client
        self.finished = False  # the whole response went to the client
        self.disconnected = False


async def _watch_disconnect(receive: Receive, state: _RequestState) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
    # Servers also report "disconnect" once the response is complete; that is not a
    # client going away.
    if not state.finished and state.task is not None:
        state.disconnected = True
        state.task.cancel()


_TOO_LARGE = b"\0too-large"


async def _read_body(receive: Receive, content_length: bytes | None, limit: int) -> bytes | None:
    """The whole body; None if the client left; _TOO_LARGE past ``limit`` bytes."""
    if content_length is not None and content_length.isdigit() and int(content_length) > limit:
        return _TOO_LARGE
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return _TOO_LARGE
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _answer(send: Send, answer: Answer) -> int:
    await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
    await send({"type": "http.response.body", "body": answer.body})
    return answer.status


def _log_access(scope: Scope, status: int, started: float) -> None:
    """One line per request, uvicorn's layout plus the duration; 499 = the client left."""
    client = scope.get("client")
    where = f"{client[0]}:{client[1]}" if client else "-"
    query = scope.get("query_string", b"")
    target = scope["path"] + ("?" + query.decode("latin-1") if query else "")
    access_logger.info(
        '%s - "%s %s HTTP/%s" %d %.1fms',
        where,
        scope["method"],
        target,
        scope.get("http_version", "1.1"),
        status,
        (time.perf_counter() - started) * 1000,
    )


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
