"""The HTTP front: the ASGI app every HTTP server of the toolkit runs — the node's proxy
(``ProxyActor``), an ingress replica serving the connections handed to it (direct
ingress), and the in-process test client — which routes each request to an application.

Longest ``route_prefix`` wins; a path no application serves is 404 (``/-/`` pages are the
toolkit's own: ``pages.py``). Each HTTP request is owned by its ``HTTPCycle``
(``cycle.py``), each WebSocket by its ``SocketCycle`` (``websocket.py``); where it goes is
chosen once (``upstream.py``). The proxy honours or creates ``x-request-id`` and returns
it. Overload is 503 with ``Retry-After``; a replica lost after it took the request is 502
(a safe method is sent once more first: ``forward.py``). The path is kept whole and the
prefix becomes ``root_path``, so the app's own routes, ``/docs`` and ``/openapi.json``
work under its prefix.
"""

from __future__ import annotations

from starlette.types import Receive, Scope, Send

from app_toolkit import metrics
from app_toolkit._runtime.front import key_door
from app_toolkit._runtime.front.access_log import AccessLog
from app_toolkit._runtime.front.body import BodyBudget
from app_toolkit._runtime.front.channel_upstream import ChannelUpstream
from app_toolkit._runtime.front.cycle import FrontRules, HTTPCycle
from app_toolkit._runtime.front.dashboard import Dashboard, StatusSource
from app_toolkit._runtime.front.key_check import KeyRing, preflight, unauthorized, with_cors
from app_toolkit._runtime.front.key_door import KeyDoor
from app_toolkit._runtime.front.key_limits import KeyLimits
from app_toolkit._runtime.front.metrics_page import Gather
from app_toolkit._runtime.front.pages import ToolkitPages
from app_toolkit._runtime.front.path_match import AppMatcher, match_app, route_path
from app_toolkit._runtime.front.scope import read_headers
from app_toolkit._runtime.front.upstream import InReplica, Placement
from app_toolkit._runtime.front.websocket import SocketCycle
from app_toolkit._runtime.messages import HTTPResponse
from app_toolkit._runtime.routing.subscriber import TableSubscriber
from app_toolkit._runtime.tables import APPLICATIONS_KEY, ApplicationTable, Table
from app_toolkit.config import HTTPOptions
from app_toolkit.metrics import FamilySnapshot


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
        local: InReplica | None = None,
    ) -> None:
        self.subscriber = subscriber
        self.http = http
        access_log = AccessLog() if http.access_log else None
        self.rules = FrontRules(http, http.shard_key_header.lower().encode("latin-1"), access_log)
        channel = ChannelUpstream(subscriber, BodyBudget(http.max_buffered_body_bytes))
        self.placement = Placement(subscriber, channel, local)
        self.local = local
        self.keys = KeyRing(http) if http.keys_required else None
        # Keys' limits are asked of the controller's ledger (only keys carry limits).
        self.limits = KeyLimits(subscriber.take_quota if self.keys is not None else None)
        # An open route's app may let a request in as a key too (``admit_key``), here.
        self.door = KeyDoor(self.keys, self.limits) if self.keys is not None else None
        if self.door is not None:
            key_door.install(self.door)
        # Snapshots for /-/metrics and the dashboard: this process's, unless the backend
        # knows more (a node's, a cluster's).
        gather = gather or _this_process
        self.dashboard = Dashboard(http, status, gather)
        self.pages = ToolkitPages(self, gather)
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

    def routes(self, app: str) -> bool:
        """The proxy has the routes of application ``app`` (its table has arrived)."""
        return any(route.app == app for route in self.apps)

    def close(self) -> None:
        """The server is stopping: end the streams the proxy itself keeps open."""
        self.dashboard.close()
        self.flush_logs()

    def stopped(self) -> None:
        """The server has stopped (its requests ended): no more asks of the keys' ledger,
        and the access lines that wait are written."""
        self.limits.close()  # (its door stays installed: a late admit_key still meets the limits)
        self.flush_logs()

    def flush_logs(self) -> None:
        """Write the access lines that wait for their batch."""
        if self.rules.access_log is not None:
            self.rules.access_log.flush()

    @staticmethod
    def _at_the_door(keys: KeyRing, scope: Scope, cycle: HTTPCycle) -> HTTPResponse | None:
        """With API keys on, the answer a request to an app gets before it goes anywhere
        (a CORS preflight's, by the app's own policy; else 401 without a valid key), or
        None: it goes on."""
        assert cycle.matched is not None
        if scope["method"] == "OPTIONS" and (answer := preflight(scope, cycle.matched.cors)) is not None:
            return answer
        if keys.admits(scope, cycle.headers, cycle.keyless):
            return None
        return unauthorized(cycle.request_id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = route_path(scope)
            matched = match_app(self.apps, path) if self.loaded else None
            cycle = HTTPCycle(scope, receive, send, self.rules, matched, path)
            if cycle.deployment is None:
                await cycle.run(self.pages)
            elif self.keys is None:
                await cycle.run(self.placement.choose(cycle.deployment, cycle.headers))
            elif (early := self._at_the_door(self.keys, scope, cycle)) is not None:
                if early.status == 401:  # (a preflight's answer has the policy's headers)
                    early = await with_cors(early, scope, matched.cors if matched is not None else None)
                await cycle.refuse(early)
            elif (limits := self.keys.limits(scope)) is None:
                await cycle.run(self.placement.choose(cycle.deployment, cycle.headers))
            elif (over := await self.limits.enter(limits, cycle.request_id)) is not None:
                await cycle.refuse(
                    await with_cors(over, scope, matched.cors if matched is not None else None)
                )
            else:
                try:
                    await cycle.run(self.placement.choose(cycle.deployment, cycle.headers))
                finally:
                    self.limits.leave(limits)
        elif kind == "websocket":
            path = route_path(scope)
            matched = match_app(self.apps, path) if self.loaded else None
            headers = read_headers(scope, self.rules.shard_header)
            deployment, _, keyless = (
                matched.target("websocket", None, path) if matched is not None else _NOWHERE
            )
            socket = SocketCycle(scope, receive, send, self.http, headers, matched, deployment)
            choose = self.placement.choose if self.loaded else None
            if deployment is None or self.keys is None:
                await socket.run(choose)
            elif not self.keys.admits(scope, headers, keyless):
                await socket.deny(unauthorized(socket.request_id))
            elif (limits := self.keys.limits(scope)) is None:
                await socket.run(choose)
            elif (over := await self.limits.enter(limits, socket.request_id)) is not None:
                await socket.deny(over)
            else:
                try:
                    await socket.run(choose)
                finally:
                    self.limits.leave(limits)
        elif kind == "lifespan":
            await _lifespan(receive, send)


_NOWHERE = (None, None, False)


async def _this_process() -> list[list[FamilySnapshot]]:
    return [metrics.snapshot()]


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
