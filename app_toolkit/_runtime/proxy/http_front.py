"""The HTTP front: the ASGI app every HTTP server of the toolkit runs — the node's proxy
(``ProxyActor``), and an ingress replica serving the connections handed to it (direct
ingress) — which routes each request to an application's ingress.

Longest ``route_prefix`` wins; an unknown path is 404. The proxy honours or creates
``x-request-id`` and returns it. Overload is 503 with ``Retry-After``; a replica lost
mid-request is 503 too. The path is kept whole and the prefix becomes ``root_path``, so
the app's own routes, ``/docs`` and ``/openapi.json`` work under its prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from starlette.types import Receive, Scope, Send

from app_toolkit import metrics
from app_toolkit._runtime import request_context, tracing
from app_toolkit._runtime.answers import (
    error_answer,
    json_answer,
    no_route,
    send_answer,
    unavailable,
)
from app_toolkit._runtime.messages import (
    DeploymentID,
    HTTPRequest,
    HTTPResponse,
)
from app_toolkit._runtime.proxy.access_log import AccessLog
from app_toolkit._runtime.proxy.body import Body, BodyBudget, BodyPump, declared_too_large, read_body
from app_toolkit._runtime.proxy.dashboard import PREFIX as DASHBOARD
from app_toolkit._runtime.proxy.dashboard import Dashboard, StatusSource
from app_toolkit._runtime.proxy.direct import LocalIngress, serve_in_replica
from app_toolkit._runtime.proxy.forward import forward
from app_toolkit._runtime.proxy.http_guard import REQUEST_LINK, RequestLink
from app_toolkit._runtime.proxy.metrics_page import CONTENT_TYPE, Gather, allowed, parse_networks, render
from app_toolkit._runtime.proxy.path_match import OPERATOR_PREFIX, AppMatcher, match_app
from app_toolkit._runtime.proxy.request_state import CLIENT_CLOSED, RequestState, watch_disconnect
from app_toolkit._runtime.proxy.scope import (
    RequestHeaders,
    forward_in_place,
    forwarded_scope,
    parse_timeout,
    read_headers,
    route_path,
)
from app_toolkit._runtime.proxy.websocket import serve_websocket
from app_toolkit._runtime.routing.subscriber import TableSubscriber
from app_toolkit._runtime.tables import APPLICATIONS_KEY, ApplicationTable, Table
from app_toolkit.config import HTTPOptions
from app_toolkit.metrics import FamilySnapshot

logger = logging.getLogger("app_toolkit.proxy")


class HTTPFront:
    """The ASGI application the proxy's HTTP server serves, and an ingress replica's for
    the connections handed to it (``local``: that replica, which serves what it may
    itself)."""

    def __init__(
        self,
        subscriber: TableSubscriber,
        http: HTTPOptions,
        gather: Gather | None = None,
        status: StatusSource | None = None,
        local: LocalIngress | None = None,
    ) -> None:
        self.subscriber = subscriber
        self.http = http
        #: The ingress replica this process runs (direct ingress): it serves the requests
        #: of its deployment that need no other replica, while it has a free slot.
        self.local = local
        self._local_id: DeploymentID | None = None  # the table's ID object equal to local's
        #: Snapshots for /-/metrics: this process's, unless the backend knows more.
        self.gather = gather or _this_process
        self.dashboard = Dashboard(http, status, self.gather)
        self.metrics_readers = parse_networks(http.metrics_allow_ips)
        self.budget = BodyBudget(http.max_buffered_body_bytes)
        self.access_log = AccessLog() if http.access_log else None
        self.shard_header = http.shard_key_header.lower().encode("latin-1")
        self.apps: list[AppMatcher] = []  # longest route_prefix first
        #: The controller has answered with the application table: until then every path,
        #: /-/healthz included, is 503 (a route not loaded yet is not a missing route).
        self.loaded = False
        #: Its node is leaving (Ray drains it): /-/healthz answers 503, so load balancers
        #: send elsewhere while the node's replicas move and its requests finish.
        self.leaving = False
        self.ready = subscriber.watch(APPLICATIONS_KEY, self._set_apps)

    def _set_apps(self, table: Table | None) -> None:
        routes = [
            AppMatcher(info) for info in (table.applications if isinstance(table, ApplicationTable) else ())
        ]
        routes.sort(key=lambda route: len(route.route_prefix), reverse=True)
        self.apps = routes
        self.loaded = True
        # Subscribe now to what requests will go to; an ingress replica's front (direct
        # ingress) only to its own application's (others' on first use: replicas are many).
        for route in routes:
            if self.local is None or route.app == self.local.deployment.app:
                for deployment in route.deployments:
                    self.subscriber.dispatcher(deployment)

    def in_replica(self, deployment: DeploymentID, headers: RequestHeaders) -> LocalIngress | None:
        """The replica in this process, if it may serve this request or WebSocket itself
        (the one place this is decided; whether it has a free slot is its own to say): it
        is its deployment's, asks for no multiplexed model or shard (their replica is
        chosen by key), and no traffic policy (a split, a shadow) applies to the deployment
        (``has_policy`` is set when a table arrives)."""
        local = self.local
        if local is None or headers.model_id or headers.shard_key:
            return None
        if deployment is not self._local_id:  # the route tables' own object, once compared
            if deployment != local.deployment:
                return None
            self._local_id = deployment
        return None if self.subscriber.dispatcher(deployment).has_policy else local

    def routes(self, app: str) -> bool:
        """The proxy has the routes of application ``app`` (its table has arrived)."""
        return any(route.app == app for route in self.apps)

    def close(self) -> None:
        """The server is stopping: end the streams the proxy itself keeps open."""
        self.dashboard.close()
        self.flush_logs()

    def flush_logs(self) -> None:
        """Write the access lines that wait for their batch."""
        if self.access_log is not None:
            self.access_log.flush()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            state = RequestState(asyncio.current_task(), time.perf_counter())
            try:
                await self._http(scope, receive, send, state)
            finally:
                labels = (state.app, state.label, scope["method"], str(state.status))
                HTTP_REQUESTS.inc(*labels)
                took = time.perf_counter() - state.arrived
                HTTP_DURATION.observe(took, *labels)
                if self.access_log is not None and state.logged:
                    self.access_log.add(scope, state.status, took, state.request_id, state.app, state.label)
        elif kind == "websocket":
            routes = self.apps if self.loaded else None
            await serve_websocket(
                routes,
                self.subscriber.dispatcher,
                scope,
                receive,
                send,
                self.shard_header,
                self.in_replica,
                id_headers=self.http.request_id_headers,
            )
        elif kind == "lifespan":
            await _lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send, state: RequestState) -> None:
        """Serve one request: an operator page, a refusal, or its app's (``_to_app``)."""
        path = route_path(scope)
        headers = read_headers(scope, self.shard_header)
        request_id = state.request_id = headers.request_id
        route = match_app(self.apps, path) if self.loaded else None
        if route is not None:
            state.app, state.target, state.logged = route.app, route.route_prefix, route.access_log
            state.prefix = "" if route.route_prefix == "/" else route.route_prefix
            await self._to_app(scope, receive, send, state, route, path, headers)
            return
        with request_context.request_scope(request_id):  # for this request's log records
            if path == "/-/metrics":  # served before the routes are loaded, too
                state.target = path
                state.status = await self._metrics(request_id, scope, send)
            elif path == DASHBOARD or path.startswith(DASHBOARD + "/"):  # also while the routes load
                state.target = DASHBOARD
                state.status = await self.dashboard.serve(path, scope, receive, send, request_id)
            elif not self.loaded:
                why = "the proxy has not loaded its routes yet"
                state.status = await send_answer(send, unavailable(why, request_id))
            elif path.startswith(OPERATOR_PREFIX):
                state.target = path if path in _BUILTINS else ""
                state.status = await self._builtin(path, request_id, send)
            else:
                state.status = await send_answer(send, no_route(path, request_id))

    async def _to_app(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        state: RequestState,
        route: AppMatcher,
        path: str,
        headers: RequestHeaders,
    ) -> None:
        """Serve the request with the replica in this process on the short path, or
        (:meth:`_forward`) with every rule a deadline or an exported span needs."""
        deployment, deadline_s = route.target("http", scope["method"], path)
        link: RequestLink | None = scope.get(REQUEST_LINK)
        if link is not None and (handed := link.handed) is not None:
            handed.table.set_request_id(handed.slot, state.request_id)  # a 502's, should we die
        if (
            link is not None
            and deadline_s is None
            and headers.timeout is None
            and self.http.request_timeout_s is None
            and not tracing.exporting()
            and (local := self._admitted_here(deployment, headers, link)) is not None
        ):
            await self._in_replica(local, scope, receive, send, state, route, headers, link)
            return  # the replica entered the request's context
        with request_context.request_scope(state.request_id):  # for this request's log records
            await self._forward(scope, receive, send, state, route, headers, deployment, deadline_s, link)

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        state: RequestState,
        route: AppMatcher,
        headers: RequestHeaders,
        deployment: DeploymentID,
        deadline_s: float | None,
        link: RequestLink | None,
    ) -> None:
        """Read the body and forward the request to the app's replicas (or the one in
        this process), within its deadline, cancelled if the client leaves."""
        request_id = state.request_id
        timeout_s = parse_timeout(headers.timeout)
        if isinstance(timeout_s, str):
            state.status = await send_answer(send, error_answer(400, timeout_s, request_id))
            return
        for limit in (deadline_s, self.http.request_timeout_s):
            if limit is not None and (timeout_s is None or limit < timeout_s):
                timeout_s = limit
        body = _NO_BODY
        watching = False
        watcher: asyncio.Future[None] | None = None
        state.link = link
        span = (
            tracing.start(f"{scope['method']} {route.route_prefix}", "server", headers.caller)
            if tracing.exporting()
            else None
        )
        try:
            # The deadline covers the upload too (a slow one gets 408, not a replica's time).
            async with asyncio.timeout(timeout_s) if timeout_s is not None else _NO_DEADLINE:
                # Served by the replica in this process (direct ingress), if it has a slot.
                local = self._admitted_here(deployment, headers, link)
                if headers.has_body and local is None:
                    body = await read_body(receive, headers.content_length, self.http, self.budget, link)
                if body.refusal == CLIENT_CLOSED:
                    state.status = CLIENT_CLOSED  # the client went away before sending its body
                    return
                if body.refusal:
                    state.status = await send_answer(send, body.answer(self.http, request_id))
                    return
                # Watch for the client going away: the request is then cancelled wherever
                # it is (dropped from the queue, or cancelled on the replica). Our HTTP
                # protocol calls the hook; under another server, a task waits for it.
                watching = True
                if link is not None:
                    link.on_client_left = state.client_left
                elif not body.more:  # else the body's pump hears it, once the body is sent
                    watcher = asyncio.ensure_future(watch_disconnect(receive, state))
                proxy_span = span.trace if span is not None else None
                if local is not None:
                    trace = forward_in_place(
                        scope, route, headers, proxy_span, id_headers=self.http.request_id_headers
                    )
                    await serve_in_replica(local, scope, receive, send, state, headers, self.http, trace)
                    return
                forwarded, trace = forwarded_scope(
                    scope, route, headers, proxy_span, id_headers=self.http.request_id_headers
                )
                request = HTTPRequest(
                    request_id, forwarded, body.data, body.more, trace.traceparent, trace.state
                )
                dispatcher = self.subscriber.dispatcher(deployment)
                if not body.more:
                    await forward(dispatcher, request, send, state, headers.model_id, headers.shard_key)
                    return
                async with BodyPump(receive, body, self.http, state) as pump:
                    await forward(
                        dispatcher, request, send, state, headers.model_id, headers.shard_key, pump.start
                    )
        except asyncio.CancelledError:
            if not state.left():
                raise
        except TimeoutError:
            if not watching or (state.uploading and not state.started):
                logger.info(
                    "Request %s: the upload outlasted the deadline of %s s (408)", request_id, timeout_s
                )
                detail = f"Request Timeout: the body did not arrive within the deadline of {timeout_s} s"
                state.status = await send_answer(send, error_answer(408, detail, request_id))
            else:
                logger.info("Request %s: deadline of %s s passed (504)", request_id, timeout_s)
                if not state.started:
                    detail = f"Gateway Timeout: the request took longer than {timeout_s} s"
                    state.status = await send_answer(send, error_answer(504, detail, request_id))
        finally:
            state.finished = True
            self.budget.give(body.held)
            if watcher is not None:
                watcher.cancel()
            if link is not None:
                link.on_client_left = None
            if span is not None:
                _end_span(span, scope, state)

    def _admitted_here(
        self, deployment: DeploymentID, headers: RequestHeaders, link: RequestLink | None
    ) -> LocalIngress | None:
        """The replica in this process, with a slot taken for this request, if it serves
        it on the connection it owns; None sends the request the long way (a body declared
        too large is refused there, before any app runs)."""
        if link is None or declared_too_large(headers.content_length, self.http):
            return None
        local = self.in_replica(deployment, headers)
        return local if local is not None and local.admit() is None else None

    async def _in_replica(
        self,
        local: LocalIngress,
        scope: Scope,
        receive: Receive,
        send: Send,
        state: RequestState,
        route: AppMatcher,
        headers: RequestHeaders,
        link: RequestLink,
    ) -> None:
        """What :meth:`_to_app` does for a request the replica in this process serves
        with no deadline and no span to export (most requests on a replica-owned
        connection), without the steps those need; its slot is taken."""
        state.link = link
        link.on_client_left = state.client_left
        try:
            trace = forward_in_place(scope, route, headers, None, id_headers=self.http.request_id_headers)
            await serve_in_replica(local, scope, receive, send, state, headers, self.http, trace)
        except asyncio.CancelledError:
            if not state.left():
                raise
        finally:
            state.finished = True
            link.on_client_left = None

    async def _builtin(self, path: str, request_id: str, send: Send) -> int:
        if path == "/-/healthz":
            if self.leaving:
                body = {"status": "draining", "detail": "This node is being drained."}
                return await send_answer(send, json_answer(503, body, request_id))
            return await send_answer(send, json_answer(200, {"status": "ok"}, request_id))
        if path == "/-/routes":
            return await send_answer(
                send, json_answer(200, {r.route_prefix: r.app for r in self.apps}, request_id)
            )
        return await send_answer(send, no_route(path, request_id))

    async def _metrics(self, request_id: str, scope: Scope, send: Send) -> int:
        client = scope.get("client")
        if not allowed(self.metrics_readers, client[0] if client else None):
            detail = "Forbidden: this address may not read metrics (see metrics_allow_ips)"
            return await send_answer(send, error_answer(403, detail, request_id))
        body = render(await self.gather())
        headers = [(b"content-type", CONTENT_TYPE.encode()), (b"x-request-id", request_id.encode())]
        return await send_answer(send, HTTPResponse(200, headers, body))


def _end_span(span: tracing.Span, scope: Scope, state: RequestState) -> None:
    if state.route:
        span.rename(f"{scope['method']} {state.label}")
        span.set("http.route", state.label)
    span.set("http.request.method", scope["method"])
    span.set("http.response.status_code", state.status)
    span.set("app_toolkit.application", state.app)
    span.end(f"HTTP {state.status}" if state.status >= 500 else "")


async def _this_process() -> list[list[FamilySnapshot]]:
    return [metrics.snapshot()]


_NO_BODY = Body()
_NO_DEADLINE = contextlib.nullcontext()
_BUILTINS = ("/-/healthz", "/-/routes", "/-/metrics")

HTTP_REQUESTS = metrics.Counter(
    "app_toolkit_http_requests_total",
    "HTTP requests the proxy answered",
    ("application", "route", "method", "status"),
)
HTTP_DURATION = metrics.Histogram(
    "app_toolkit_http_request_duration_seconds",
    "From the request's arrival at the proxy to the end of its response",
    ("application", "route", "method", "status"),
)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
