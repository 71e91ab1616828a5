"""One HTTP request or WebSocket through a replica's ASGI app, and what the client gets
when the app fails: uvicorn's ``run_asgi`` rules, written once for both ways an app's
answer leaves its replica — to its own client on a connection the replica owns
(``direct_ingress/replica_upstream.py``), or to the proxy over the channel (``asgi.py``). Each way is an
:class:`HTTPOut` or a :class:`SocketOut`; the rules are here.

HTTP: an exception before the response's head is a generic 500 (``answers.escaped``: or
the overload answer of an overload error that escaped), and so is an app that returns
without a response; after the head, an exception or a return
before the body's end cuts the response off (a client must not take a truncated body for
a whole one); an exception after the whole response is only logged. An app that fails
reading a body the front refused (413, 408) is not answered here: the front answers the
refusal.

WebSocket: ``answers.websocket_end`` when the app raises or returns without closing, and
``answers.restart_end`` (1012) at the replica's drain deadline; what the app sends after
its socket ended is dropped. A failure around the app (finding it, starting its span,
making its context) is the app's own: the replica runs an app that raises it
(``asgi.failing_app``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol, cast

from starlette.types import ASGIApp, Message, Receive, Scope

from app_toolkit._runtime import answers, request_context
from app_toolkit._runtime.drain_signal import DrainSignal
from app_toolkit._runtime.messages import HTTPResponse

logger = logging.getLogger("app_toolkit.replica")


class HTTPOut(Protocol):
    """Where one request's response goes."""

    @property
    def head_seen(self) -> bool:
        """The app sent its ``http.response.start`` (held or sent on)."""
        ...

    @property
    def complete(self) -> bool:
        """The whole response went out."""
        ...

    async def send(self, message: Message) -> None:
        """The app's ``send``."""
        ...

    def end(self) -> None:
        """The app returned, raised or was cancelled: nothing more comes from it."""
        ...

    def refused(self) -> bool:
        """The front refused the body while the app read it (and answers that itself)."""
        ...

    async def answer(self, response: HTTPResponse) -> None:
        """Answer with ``response`` instead of the app (no head went out)."""
        ...

    async def cut_off(self, why: str) -> None:
        """End the response after its head without completing it (a head still held goes
        out first, as uvicorn had sent it)."""
        ...


async def run_app(
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    out: HTTPOut | SocketOut,
    request_id: str,
    lifespan_state: dict[str, object],
) -> str:
    """One request or WebSocket through ``app`` (``out`` is its scope type's), within its
    replica's request context; returns the path template of the route that served it."""
    if scope["type"] == "http":
        await run_http(app, scope, receive, cast(HTTPOut, out), request_id, lifespan_state)
    else:
        drain = request_context.drain_signal.get()
        await run_websocket(app, scope, receive, cast(SocketOut, out), request_id, lifespan_state, drain)
    return request_context.route_template(scope)


async def run_http(
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    out: HTTPOut,
    request_id: str,
    lifespan_state: dict[str, object],
) -> None:
    """Run one request through ``app``, its response going to ``out``."""
    scope["state"] = dict(lifespan_state)
    try:
        await app(scope, receive, out.send)
    except asyncio.CancelledError:
        out.end()
        raise
    except Exception as exc:  # noqa: BLE001 - the app's failure: answered by the rules above
        out.end()
        await _failed(out, exc, request_id)
        return
    out.end()
    if not out.complete:
        await _failed(out, None, request_id)


async def _failed(out: HTTPOut, error: Exception | None, request_id: str) -> None:
    """The app raised ``error`` (None: returned) without a complete response, or after it."""
    if out.refused():  # the app failed (or gave up) reading a body the front refused
        logger.info("Request %s: the body was refused while the app read it", request_id)
        return
    if error is not None:
        # The traceback goes to the log with the id; the client gets no internals.
        logger.error("Request %s failed", request_id, exc_info=error)
        if out.complete:
            return  # it raised after its response (Starlette's error middleware does)
    elif out.head_seen:
        logger.error("Request %s: the app returned in the middle of its response", request_id)
    else:
        logger.error("Request %s: the app returned without a response", request_id)
    if out.head_seen:
        await out.cut_off("the app failed" if error is not None else "the app returned")
    else:
        await out.answer(answers.escaped(error, request_id))


class SocketOut(Protocol):
    """Where one WebSocket's messages from the app go."""

    async def emit(self, message: Message) -> None:
        """Send one of the app's messages on (waiting for room, as its sends wait)."""
        ...

    async def close_with(self, messages: Sequence[Message]) -> None:
        """Send the toolkit's messages that end the socket (a client that left is not
        told). Over the channel they do not wait for the flow-control window the app's own
        send may be waiting on; to a client of this replica, uvicorn's send waits for the
        socket to take them, bounded by the drain's ``LAST_EVENT_S``."""
        ...

    def restarted(self) -> None:
        """The socket was closed with 1012 at the drain deadline: the app's next
        ``receive()`` hears its client is gone."""
        ...


async def run_websocket(
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    out: SocketOut,
    request_id: str,
    lifespan_state: dict[str, object],
    drain: DrainSignal | None,
) -> None:
    """Run one WebSocket connection through ``app`` (its ``websocket.connect`` is the
    first message ``receive`` gives), its messages going to ``out``."""
    scope["state"] = dict(lifespan_state)
    socket = _Socket(out)
    watch = drain.watch(socket.restarting) if drain is not None else None
    try:
        await app(scope, receive, socket.send)
    except asyncio.CancelledError:
        raise
    except Exception:
        logger.exception("WebSocket %s failed", request_id)
        failed = True
    else:
        failed = False  # it returned: if without closing, close it (or answer, if never accepted)
    finally:
        if watch is not None:
            await watch.close()
    await out.close_with(answers.websocket_end(socket.handshake, failed, scope, request_id))


class _Socket:
    """The app's side of one WebSocket: where its handshake stands."""

    __slots__ = ("_out", "handshake")

    def __init__(self, out: SocketOut) -> None:
        self._out = out
        self.handshake: answers.HandshakeState = "none"  # "ended": later messages drop

    async def send(self, message: Message) -> None:
        if self.handshake == "ended":
            return  # e.g. after the drain's close
        self.handshake = answers.handshake_after(self.handshake, message)
        await self._out.emit(message)

    async def restarting(self) -> None:
        """The replica's drain is at its deadline: close with 1012 so the client reconnects
        (to another replica), and tell the app its client is gone."""
        closing = answers.restart_end(self.handshake)
        if closing:
            self.handshake = "ended"
            await self._out.close_with(closing)
        self._out.restarted()
