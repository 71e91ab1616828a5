"""An ingress replica's own HTTP server (direct ingress, docs/architecture.md): it serves
the client connections the node's proxy hands it, in the replica's process.

The front is the proxy's own ASGI app and protocol (every per-request rule is the same
code), with the replica as its ``local`` ingress: a request of the replica's deployment
runs the app right here while the replica has a free slot; any other request (another
application, a per-route pool, a multiplexed model, a split, a full replica) goes through
the dispatcher, one hop, as the proxy would send it.

Draining: the hand-off socket stops taking connections, and the connections that are
between requests go back to the node's proxy, which serves them on; the others go back
once their response is complete. What is left at the end is closed as uvicorn closes
connections on shutdown (idle ones at once, busy ones after their response with
``Connection: close``).
"""

from __future__ import annotations

import asyncio
import logging

from app_toolkit._runtime.direct_ingress.handoff_listener import HandoffListener
from app_toolkit._runtime.direct_ingress.replica_upstream import ReplicaUpstream
from app_toolkit._runtime.front.dashboard import StatusSource
from app_toolkit._runtime.front.http_front import HTTPFront
from app_toolkit._runtime.front.metrics_page import Gather
from app_toolkit._runtime.front.server import ProxyServer, serve
from app_toolkit._runtime.replica.replica import ReplicaCore
from app_toolkit._runtime.routing.subscriber import TableSubscriber
from app_toolkit.config import HTTPOptions

logger = logging.getLogger("app_toolkit.replica")

_GIVE_BACK_EVERY_S = 0.02  # while draining: how often connections that became idle go back


class ReplicaFront:
    """Serves the connections handed to one ingress replica."""

    def __init__(
        self,
        core: ReplicaCore,
        http: HTTPOptions,
        subscriber: TableSubscriber,
        gather: Gather | None = None,
        status: StatusSource | None = None,
    ) -> None:
        self._core = core
        self._http = http
        self._subscriber = subscriber
        self._gather = gather  # the node's metrics for /-/metrics, and its status page's
        self._status = status
        self._server: ProxyServer | None = None
        self._listener: HandoffListener | None = None

    async def start(self) -> str:
        """Start serving; returns the hand-off socket's path (for the replica's info)."""
        # The server's requests start from this task: they inherit the replica's values.
        self._core.enter_serving()
        local = ReplicaUpstream(self._core, self._subscriber)
        front = HTTPFront(self._subscriber, self._http, self._gather, self._status, local=local)
        self._server = await serve(front, self._http, None, front.close, front.stopped)
        app = self._core.deployment.app
        # Until the front has its application's routes, connections go back to the proxy.
        self._listener = HandoffListener(self._server.adopt, lambda: front.routes(app))
        return self._listener.start()

    def give_back_idle(self) -> int:
        """Pass the connections between requests back to the proxy; returns how many
        connections remain here."""
        server, listener = self._server, self._listener
        if server is None or listener is None:
            return 0
        remaining = 0
        for connection in server.connections():
            if not connection.hand_back(listener.give_back):
                remaining += 1
        return remaining

    async def drain(self, timeout_s: float) -> None:
        """Take no new connections and give the open ones back to the proxy as they
        become idle, for at most ``timeout_s``."""
        if self._listener is None:
            return
        self._listener.stop_listening()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.give_back_idle() and loop.time() < deadline:
            await asyncio.sleep(_GIVE_BACK_EVERY_S)

    async def stop(self, timeout_s: float) -> None:
        """Close what is left (bounded) and the hand-off socket."""
        if self._server is not None:
            await self._server.stop(timeout_s)
        if self._listener is not None:
            self._listener.close()
