"""uvicorn beyond its documented API: what the front takes from uvicorn's internals, in one
place, so that the cap in pyproject.toml (``uvicorn[standard]>=0.38,<0.55``) has one list
to check when it is lifted (``make compat`` runs the suite on the newest uvicorn and says
which contract broke; tests/unit/test_uvicorn_contract.py names each assumption).

Each entry: the internal, what the front does with it, and the oldest release it was
checked on (the newest is the cap's).

- ``HttpToolsProtocol``: ``http_guard.GuardedHttpProtocol`` subclasses it: it overrides
  ``connection_made``, ``connection_lost``, ``data_received``, ``on_message_begin``,
  ``on_headers_complete`` and ``on_response_complete``, calling through, and reads the
  protocol's ``cycle``, ``flow``, ``pipeline``, ``transport`` and keep-alive timer. It
  calls ``send_400_response`` with a stand-in transport that only writes and notes the
  close (it lingers instead). Checked on 0.38.0.
- ``RequestResponseCycle``: ``request_link.RequestLink`` reads a request's cycle
  (``response_complete``, ``more_body``, ``waiting_for_100_continue``, ``flow``) and gives
  it a transport that joins a response's writes. Checked on 0.38.0.
- ``Server.serve(sockets=[])`` with ``Config.http_protocol_class`` and the server's
  ``server_state``: ``server.py`` runs uvicorn without a listener of its own and builds
  protocols for connections accepted elsewhere. Checked on 0.38.0.

Made here so that every release in the range serves alike:

- ``WebSocketProtocol``: WebSockets on websockets' sans-I/O protocol, what uvicorn's
  ``auto`` picks from 0.50 on; before, ``auto`` picked the legacy one, which websockets 14
  and later deprecate (a ``DeprecationWarning`` at every start). Before 0.53 that one
  - answered a refused handshake (``websocket.http.response``) with its own
    ``Content-Length`` and ``Content-Type`` *and* the app's (two lengths: clients reject
    the response): there the app's two are left out, so such a response is
    ``text/plain; charset=utf-8`` whatever the app said (docs/compatibility.md);
  - never paused its sends when the client reads slowly (no ``pause_writing``: the
    transport's buffer grew without bound): here it pauses them as 0.53 does.
  Before 0.44 it sends no pings (docs/compatibility.md). Its ``handle_connect``, which
  makes the scope, is extended to put the client's TLS certificate in it (read of its
  ``transport``). Checked on 0.38.0.
"""

from __future__ import annotations

from typing import Any

import uvicorn
from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request

from app_toolkit._runtime.front.https import client_cert_of
from app_toolkit._runtime.front.scope import CLIENT_CERT

__all__ = ["RELEASE", "HttpToolsProtocol", "RequestResponseCycle", "WebSocketProtocol"]

#: uvicorn's release, (major, minor): the one place the toolkit reads it.
RELEASE = tuple(int(part) for part in uvicorn.__version__.split(".")[:2])
#: Before 0.53 a refusal's response carries uvicorn's length and type besides the app's,
#: and sends do not wait while the transport is paused.
_BEFORE_0_53 = RELEASE < (0, 53)
_DOUBLED = (b"content-length", b"content-type")


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol, with 0.53's valid refusals and paused sends
    on the releases before it (unchanged from 0.53 on), and the client's TLS certificate
    in the scope (``handle_connect`` makes the scope)."""

    if _BEFORE_0_53:

        def pause_writing(self) -> None:
            self.writable.clear()  # send() waits on it

        def resume_writing(self) -> None:
            self.writable.set()

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            self.writable.set()  # a send waiting on a paused transport that is gone ends

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        scope: Scope | None = getattr(self, "scope", None)  # (none for a refused handshake)
        cert = client_cert_of(self.transport) if scope is not None else None
        if scope is not None and cert is not None:  # (its API key may be the one it names)
            scope[CLIENT_CERT] = cert

    async def send(self, message: Any) -> None:
        if _BEFORE_0_53 and message["type"] == "websocket.http.response.start":
            kept = [
                (name, value) for name, value in message.get("headers", []) if name.lower() not in _DOUBLED
            ]
            message = {**message, "headers": kept}
        await super().send(message)
