"""One WebSocket connection as the front serves it: its owner, :class:`SocketCycle`.

Made once by the front from the scope, ``receive``, ``send``, its headers and the
application route it matched; :meth:`SocketCycle.run` reads the client's ``websocket.connect``,
refuses what no replica may take, and hands the connection to an ``Upstream``
(``upstream.py``), which pins it to one replica for its life: over the channel, or in
this replica. The connection holds a replica slot while open, so it counts as load.
Overload: browsers (they send ``Origin``) cannot read a refused handshake, so they get
accept-then-close 1013; other clients get a 503 denial response.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from starlette.types import Receive, Scope, Send

from app_toolkit._runtime.answers import can_deny, denial, unavailable
from app_toolkit._runtime.front import stream_metrics
from app_toolkit._runtime.front.path_match import AppMatcher
from app_toolkit._runtime.front.scope import RequestHeaders
from app_toolkit._runtime.messages import CLOSE_POLICY, CLOSE_TRY_AGAIN_LATER, DeploymentID, HTTPResponse
from app_toolkit.config import HTTPOptions


class SocketResponder(Protocol):
    """What serves a WebSocket once its owner runs (an ``Upstream``)."""

    def websocket(self, socket: SocketCycle) -> Awaitable[None]:
        """Serve one WebSocket (its ``websocket.connect`` was read) for its whole life."""
        ...


#: Chooses a connection's upstream, once its handshake began (``Placement.choose``).
Choose = Callable[[DeploymentID, RequestHeaders], SocketResponder]


@dataclass(slots=True, eq=False)
class SocketCycle:
    """One WebSocket connection while the front serves it: its scope, ``receive`` and
    ``send``, what its headers say, and the application route it matched (None: none)
    with the deployment that serves it there."""

    scope: Scope
    receive: Receive
    send: Send
    http: HTTPOptions
    headers: RequestHeaders
    matched: AppMatcher | None
    deployment: DeploymentID | None

    @property
    def request_id(self) -> str:
        return self.headers.request_id

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
        await choose(self.deployment, self.headers).websocket(self)  # its slot taken in this step

    async def deny(self, answer: HTTPResponse) -> None:
        """Refused at the door (no valid API key: 401; over its key's limits: 429) before
        it is accepted, with ``answer`` where the server can send a denial response (else
        the server's 403)."""
        if (await self.receive())["type"] != "websocket.connect":
            return
        if can_deny(self.scope):
            for message in denial(answer):
                await self.send(message)
        else:
            await self.send({"type": "websocket.close", "code": CLOSE_POLICY})

    @contextlib.contextmanager
    def open(self) -> Iterator[None]:
        """Counted among the open streams while a replica serves the connection."""
        assert self.matched is not None
        app = self.matched.app
        stream_metrics.OPEN.inc(app, "websocket")
        try:
            yield
        finally:
            stream_metrics.OPEN.dec(app, "websocket")

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
