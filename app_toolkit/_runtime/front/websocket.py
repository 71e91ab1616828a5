"""One WebSocket connection as the front serves it: its owner, :class:`SocketCycle`.

Made once from the scope, ``receive``, ``send``, the application route it matched and
the front's rules; :meth:`SocketCycle.run` reads the client's ``websocket.connect``,
refuses what no replica may take, and hands the connection to an ``Upstream``
(``upstream.py``), which pins it to one replica for its life: over the channel, or in
this replica. The connection holds a replica slot while open, so it counts as load.
Overload: browsers (they send ``Origin``) cannot read a refused handshake, so they get
accept-then-close 1013; other clients get a 503 denial response.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from starlette.types import Receive, Scope, Send

from app_toolkit._runtime.answers import can_deny, denial, unavailable
from app_toolkit._runtime.front import front_metrics
from app_toolkit._runtime.front.cycle import FrontRules
from app_toolkit._runtime.front.path_match import AppMatcher
from app_toolkit._runtime.front.scope import RequestHeaders, read_headers
from app_toolkit._runtime.messages import CLOSE_POLICY, CLOSE_TRY_AGAIN_LATER, DeploymentID

logger = logging.getLogger("app_toolkit.proxy")


class SocketResponder(Protocol):
    """What serves a WebSocket once its owner runs (an ``Upstream``)."""

    async def websocket(self, socket: SocketCycle) -> None: ...


#: Chooses a connection's upstream, once its handshake began (``Placement.choose``).
Choose = Callable[[DeploymentID, RequestHeaders], SocketResponder]


class SocketCycle:
    """One WebSocket connection while the front serves it."""

    __slots__ = ("scope", "receive", "send", "http", "headers", "request_id", "matched", "deployment")

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
        self.receive = receive
        self.send = send
        self.http = rules.http
        self.headers: RequestHeaders = read_headers(scope, rules.shard_header)
        self.request_id = self.headers.request_id
        self.matched = matched
        self.deployment: DeploymentID | None = (
            matched.target("websocket", None, path)[0] if matched is not None else None
        )

    async def run(self, choose: Choose | None) -> None:
        """Serve the connection through the upstream ``choose`` picks once the client's
        handshake began (None: the front has not loaded its routes yet, and every
        connection is refused as overload)."""
        if (await self.receive())["type"] != "websocket.connect":
            return
        if choose is None:
            await self.refuse("the proxy has not loaded its routes yet")
            return
        if self.matched is None or self.deployment is None:
            await self.send({"type": "websocket.close", "code": CLOSE_POLICY})
            return
        upstream = choose(self.deployment, self.headers)  # its slot is taken in this step
        app = self.matched.app
        front_metrics.OPEN.inc(app, "websocket")
        try:
            await upstream.websocket(self)
        finally:
            front_metrics.OPEN.dec(app, "websocket")

    async def refuse(self, why: str) -> None:
        """No replica takes the connection: tell the client to retry later, the way it can
        read (a browser cannot read a refused handshake)."""
        scope = self.scope
        is_browser = any(key == b"origin" for key, _ in scope["headers"])
        if is_browser or not can_deny(scope):
            await self.send({"type": "websocket.accept"})
            await self.send(
                {"type": "websocket.close", "code": CLOSE_TRY_AGAIN_LATER, "reason": f"{why}; retry later"}
            )
            return
        for message in denial(unavailable(why, self.request_id)):
            await self.send(message)
