"""The HTTP front: the ASGI app every HTTP server of the toolkit runs — the node's proxy
(``ProxyActor``), and an ingress replica serving the connections handed to it (direct
ingress) — which routes each request to an application's ingress.

Longest ``route_prefix`` wins; an unknown path is 404. The proxy honours or creates
``x-request-id`` and returns it. Overload is 503 with ``Retry-After``; a replica lost
after it took the request is 502 (a safe method is sent once more first: ``forward.py``).
The path is kept whole and the prefix becomes ``root_path``, so the app's own routes,
``/docs`` and ``/openapi.json`` work under its prefix. Each request is owned by its
``HTTPCycle`` (``cycle.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable

from starlette.types import Receive, Scope, Send

from app_toolkit import metrics
from app_toolkit._runtime import request_context, tracing
from app_toolkit._runtime.answers import error_answer, json_answer, no_route, unavailable
from app_toolkit._runtime.front.access_log import AccessLog
from app_toolkit._runtime.front.body import Body, BodyBudget, BodyPump, declared_too_large, read_body
from app_toolkit._runtime.front.cycle import CLIENT_CLOSED, HTTPCycle, watch_disconnect
from app_toolkit._runtime.front.dashboard import PREFIX as DASHBOARD
from app_toolkit._runtime.front.dashboard import Dashboard, StatusSource
from app_toolkit._runtime.front.forward import forward
from app_toolkit._runtime.front.local_ingress import LocalIngress
from app_toolkit._runtime.front.metrics_page import CONTENT_TYPE, Gather, allowed, parse_networks, render
from app_toolkit._runtime.front.path_match import OPERATOR_PREFIX, AppMatcher, match_app
from app_toolkit._runtime.front.request_link import REQUEST_LINK, RequestLink
from app_toolkit._runtime.front.scope import (
    RequestHeaders,
    forward_in_place,
    forwarded_scope,
    parse_timeout,
    read_headers,
    route_path,
)
from app_toolkit._runtime.front.websocket import serve_websocket
from app_toolkit._runtime.messages import (
    DeploymentID,
    HTTPRequest,
    HTTPResponse,
)
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
            cycle = HTTPCycle(send, asyncio.current_task(), time.perf_counter())
            try:
                path = route_path(scope)
                headers = cycle.headers = read_headers(scope, self.shard_header)
                cycle.request_id = headers.request_id
                route = match_app(self.apps, path) if self.loaded else None
                if route is None:
                    await self._toolkit_page(scope, receive, send, cycle, path)
                    return
                cycle.to_app(route)
                upstream, timeout_s = self._upstream(scope, receive, cycle, route, path, headers)
                # The request's deadline is a layer around it, there only when it has one.
                try:
                    if timeout_s is None:
                        await upstream
                    else:  # it covers the upload too (a slow one gets 408, not a replica's time)
                        async with asyncio.timeout(timeout_s):
                            await upstream
                except asyncio.CancelledError:
                    if not cycle.left():
                        raise
                except TimeoutError:
                    with request_context.request_scope(cycle.request_id):  # for these log records
                        await self._deadline_passed(cycle, timeout_s)
                finally:
                    cycle.finished = True
                    if cycle.link is not None:
                        cycle.link.on_client_left = None
            finally:
                cycle.close(scope, self.access_log)
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

    async def _toolkit_page(
        self, scope: Scope, receive: Receive, send: Send, cycle: HTTPCycle, path: str
    ) -> None:
        """A request no app's route matches: an operator page, or a refusal."""
        request_id = cycle.request_id
        _link_noting(scope, request_id)
        with request_context.request_scope(request_id):  # for this request's log records
            if path == "/-/metrics":  # served before the routes are loaded, too
                cycle.target = path
                await self._metrics(request_id, scope, cycle)
            elif path == DASHBOARD or path.startswith(DASHBOARD + "/"):  # also while the routes load
                cycle.target = DASHBOARD
                cycle.status = await self.dashboard.serve(path, scope, receive, send, request_id)
            elif not self.loaded:
                why = "the proxy has not loaded its routes yet"
                await cycle.answer(unavailable(why, request_id))
            elif path.startswith(OPERATOR_PREFIX):
                cycle.target = path if path in _BUILTINS else ""
                await self._builtin(path, request_id, cycle)
            else:
                await cycle.answer(no_route(path, request_id))

    def _upstream(
        self,
        scope: Scope,
        receive: Receive,
        cycle: HTTPCycle,
        route: AppMatcher,
        path: str,
        headers: RequestHeaders,
    ) -> tuple[Awaitable[None], float | None]:
        """The one way every request to an app takes, to be awaited within its deadline
        (seconds, or None). Where it goes is decided once: the replica in this process,
        its slot taken (it gives it back), or the app's replicas over the channel; a
        deadline header that is not a number is answered 400 instead."""
        deployment, deadline_s = route.target("http", scope["method"], path)
        cycle.link = link = _link_noting(scope, cycle.request_id)
        timeout_s = parse_timeout(headers.timeout) if headers.timeout is not None else None
        if isinstance(timeout_s, str):
            return cycle.answer(error_answer(400, timeout_s, cycle.request_id)), None
        for limit in (deadline_s, self.http.request_timeout_s):
            if limit is not None and (timeout_s is None or limit < timeout_s):
                timeout_s = limit
        span = None
        if tracing.exporting():  # an exported span is a layer too: the replica's continues it
            cycle.span = tracing.start(f"{scope['method']} {route.route_prefix}", "server", headers.caller)
            span = cycle.span.trace if cycle.span is not None else None
        # Served here only on a connection this replica owns (with a link), and never with
        # a body declared too large: that is refused the long way, before any app runs.
        local = None
        if link is not None and not declared_too_large(headers.content_length, self.http):
            local = self.in_replica(deployment, headers)
        if local is None or local.admit() is not None:
            return self._over_channel(scope, receive, cycle, deployment, span), timeout_s
        # Our HTTP protocol tells the request that its client went away (cancelled here).
        link.on_client_left = cycle.client_left  # type: ignore[union-attr]
        trace = forward_in_place(scope, route, headers, span, id_headers=self.http.request_id_headers)
        return local.serve_http(scope, receive, cycle, self.http, trace), timeout_s

    async def _deadline_passed(self, cycle: HTTPCycle, timeout_s: float | None) -> None:
        """408 while the body was still arriving, else 504 if no head went out yet."""
        if not cycle.started and cycle.body_arriving():
            logger.info(
                "Request %s: the upload outlasted the deadline of %s s (408)", cycle.request_id, timeout_s
            )
            detail = f"Request Timeout: the body did not arrive within the deadline of {timeout_s} s"
            await cycle.answer(error_answer(408, detail, cycle.request_id))
            return
        logger.info("Request %s: deadline of %s s passed (504)", cycle.request_id, timeout_s)
        if not cycle.started:
            detail = f"Gateway Timeout: the request took longer than {timeout_s} s"
            await cycle.answer(error_answer(504, detail, cycle.request_id))

    async def _over_channel(
        self,
        scope: Scope,
        receive: Receive,
        cycle: HTTPCycle,
        deployment: DeploymentID,
        span: tracing.TraceContext | None,
    ) -> None:
        """Read the body's start, then forward the request to one of the app's replicas
        (the rest of the body streams after it), cancelled if the client leaves."""
        link, request_id = cycle.link, cycle.request_id
        headers, route = cycle.headers, cycle.matched
        assert headers is not None and route is not None  # set before a request goes to an app
        body = _NO_BODY
        watcher: asyncio.Future[None] | None = None
        with request_context.request_scope(request_id):  # for this request's log records
            try:
                if headers.has_body:
                    cycle.uploading = True  # (link-less servers: see HTTPCycle.body_arriving)
                    body = await read_body(receive, headers.content_length, self.http, self.budget, link)
                    cycle.uploading = False
                if body.refusal == CLIENT_CLOSED:
                    cycle.status = CLIENT_CLOSED  # the client went away before sending its body
                    return
                if body.refusal:
                    await cycle.answer(body.answer(self.http, request_id))
                    return
                # Watch for the client going away: the request is then cancelled wherever it
                # is (dropped from the queue, or cancelled on the replica). Our HTTP protocol
                # calls the hook; under another server, a task waits for it.
                if link is not None:
                    link.on_client_left = cycle.client_left
                elif not body.more:  # else the body's pump hears it, once the body is sent
                    watcher = asyncio.ensure_future(watch_disconnect(receive, cycle))
                forwarded, trace = forwarded_scope(
                    scope, route, headers, span, id_headers=self.http.request_id_headers
                )
                request = HTTPRequest(
                    request_id, forwarded, body.data, body.more, trace.traceparent, trace.state
                )
                dispatcher = self.subscriber.dispatcher(deployment)
                if not body.more:
                    await forward(dispatcher, request, cycle, headers.model_id, headers.shard_key)
                    return
                async with BodyPump(receive, body, self.http, cycle) as pump:
                    await forward(dispatcher, request, cycle, headers.model_id, headers.shard_key, pump.start)
            finally:
                self.budget.give(body.held)
                if watcher is not None:
                    watcher.cancel()

    async def _builtin(self, path: str, request_id: str, cycle: HTTPCycle) -> None:
        if path == "/-/healthz":
            if self.leaving:
                body = {"status": "draining", "detail": "This node is being drained."}
                await cycle.answer(json_answer(503, body, request_id))
            else:
                await cycle.answer(json_answer(200, {"status": "ok"}, request_id))
        elif path == "/-/routes":
            await cycle.answer(json_answer(200, {r.route_prefix: r.app for r in self.apps}, request_id))
        else:
            await cycle.answer(no_route(path, request_id))

    async def _metrics(self, request_id: str, scope: Scope, cycle: HTTPCycle) -> None:
        client = scope.get("client")
        if not allowed(self.metrics_readers, client[0] if client else None):
            detail = "Forbidden: this address may not read metrics (see metrics_allow_ips)"
            await cycle.answer(error_answer(403, detail, request_id))
            return
        body = render(await self.gather())
        headers = [(b"content-type", CONTENT_TYPE.encode()), (b"x-request-id", request_id.encode())]
        await cycle.answer(HTTPResponse(200, headers, body))


def _link_noting(scope: Scope, request_id: str) -> RequestLink | None:
    """The request's link to our HTTP protocol; on a connection the node's proxy handed
    over, the request's id is noted in their shared table first (a 502's, should this
    replica die before the response leaves)."""
    link: RequestLink | None = scope.get(REQUEST_LINK)
    if link is not None and (handed := link.handed) is not None:
        handed.table.set_request_id(handed.slot, request_id)
    return link


async def _this_process() -> list[list[FamilySnapshot]]:
    return [metrics.snapshot()]


_NO_BODY = Body()
_BUILTINS = ("/-/healthz", "/-/routes", "/-/metrics")


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
