"""WebSockets through the proxy: one connection pinned to one replica for its life.

The replica runs the app; the proxy relays the client's messages to it and the app's
messages back (each a ``WebSocketMessage``), close codes included. The connection holds a
replica slot while open, so it counts as load. Overload: browsers (they send ``Origin``)
cannot read a refused handshake, so they get accept-then-close 1013; other clients get a
503 denial response.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from starlette.types import Receive, Scope, Send

from app_toolkit._runtime.answers import can_deny, denial, ends_websocket, unavailable
from app_toolkit._runtime.front import stream_metrics
from app_toolkit._runtime.front.local_ingress import LocalIngress
from app_toolkit._runtime.front.path_match import AppMatcher, match_app
from app_toolkit._runtime.front.scope import (
    RequestHeaders,
    forwarded_scope,
    read_headers,
    route_path,
)
from app_toolkit._runtime.messages import (
    CLOSE_INTERNAL_ERROR,
    CLOSE_POLICY,
    CLOSE_TRY_AGAIN_LATER,
    DeploymentID,
    StreamEnd,
    WebSocketMessage,
    WebSocketOpen,
)
from app_toolkit._runtime.request_keys import SHARD_KEY_HEADER
from app_toolkit._runtime.routing.dispatcher import Dispatcher, Reply
from app_toolkit.exceptions import BackPressureError, ReplicaUnavailableError

logger = logging.getLogger("app_toolkit.proxy")

_APP_GRACE_S = 5.0  # how long an app may take to finish after the client disconnected

#: The ingress replica in this process, if it may serve a connection itself.
InReplica = Callable[[DeploymentID, RequestHeaders], LocalIngress | None]


async def serve_websocket(
    routes: list[AppMatcher] | None,
    dispatcher_for: Callable[[DeploymentID], Dispatcher],
    scope: Scope,
    receive: Receive,
    send: Send,
    shard_header: bytes = SHARD_KEY_HEADER,
    in_replica: InReplica | None = None,
    *,
    id_headers: bool,
) -> None:
    """Relay one WebSocket connection to a replica of the app its path belongs to
    (``routes`` is None until the proxy has loaded them: refused as overload). A shard
    key in ``shard_header`` pins it to the key's replica. ``in_replica``: the ingress
    replica in this process, if it may serve the connection itself (``HTTPFront.in_replica``);
    it does while it has a slot. ``id_headers``: ``HTTPOptions.request_id_headers``."""
    headers = read_headers(scope, shard_header)
    request_id = headers.request_id
    if (await receive())["type"] != "websocket.connect":
        return
    if routes is None:  # the proxy has not loaded its routes yet
        await _refuse(scope, send, request_id, "the proxy has not loaded its routes yet")
        return
    path = route_path(scope)
    route = match_app(routes, path)
    if route is None:
        await send({"type": "websocket.close", "code": CLOSE_POLICY})
        return
    deployment, _ = route.target("websocket", None, path)
    dispatcher = dispatcher_for(deployment)
    local = in_replica(deployment, headers) if in_replica is not None else None
    forwarded, trace = forwarded_scope(scope, route, headers, None, id_headers=id_headers)
    if local is not None and local.admit() is None:
        stream_metrics.OPEN.inc(route.app, "websocket")
        try:
            await local.serve_websocket(request_id, forwarded, trace, receive, send)
        finally:
            stream_metrics.OPEN.dec(route.app, "websocket")
        return
    opening = WebSocketOpen(request_id, forwarded, trace.traceparent, trace.state)
    try:
        reply = await dispatcher.send(opening, headers.model_id, headers.shard_key)
    except BackPressureError:
        await _refuse(scope, send, request_id, "too many connections")
        return
    except ReplicaUnavailableError as exc:
        logger.warning("WebSocket %s: %s", request_id, exc)
        await _refuse(scope, send, request_id, "no replica could serve the connection")
        return
    stream_metrics.OPEN.inc(route.app, "websocket")
    try:
        await _relay(reply, receive, send)
    finally:
        stream_metrics.OPEN.dec(route.app, "websocket")
        reply.exchange.cancel()
        reply.release()


async def _refuse(scope: Scope, send: Send, request_id: str, why: str) -> None:
    is_browser = any(key == b"origin" for key, _ in scope["headers"])
    if is_browser or not can_deny(scope):
        await send({"type": "websocket.accept"})
        await send(
            {"type": "websocket.close", "code": CLOSE_TRY_AGAIN_LATER, "reason": f"{why}; retry later"}
        )
        return
    for message in denial(unavailable(why, request_id)):
        await send(message)


async def _relay(reply: Reply, receive: Receive, send: Send) -> None:
    async def downstream() -> None:
        closed = False  # the app closed (or denied) the connection; later messages drop
        answer = reply.first
        while True:
            if isinstance(answer, WebSocketMessage):
                message = answer.message
                if not closed:
                    await send(message)
                    closed = ends_websocket(message)
            elif isinstance(answer, StreamEnd):
                if not closed:
                    # A fallback: the replica ends every socket itself before its END
                    # (answers.websocket_end); one that did not is closed normally here.
                    await send({"type": "websocket.close", "code": 1000})
                return
            else:  # LOST, or anything unexpected: the replica is gone
                if not closed:
                    await send({"type": "websocket.close", "code": CLOSE_INTERNAL_ERROR})
                return
            answer = await reply.exchange.recv()

    async def upstream() -> None:
        while True:
            await reply.exchange.room_to_send()  # the app has a window's worth unread
            message = await receive()
            reply.exchange.send(WebSocketMessage(dict(message)))
            if message["type"] == "websocket.disconnect":
                return

    down = asyncio.ensure_future(downstream())
    up = asyncio.ensure_future(upstream())
    try:
        done, _ = await asyncio.wait({down, up}, return_when=asyncio.FIRST_COMPLETED)
        if down not in done:
            # The client left; the app got websocket.disconnect and should finish soon.
            await asyncio.wait({down}, timeout=_APP_GRACE_S)
    finally:
        for task in (down, up):
            task.cancel()
        results = await asyncio.gather(down, up, return_exceptions=True)
        for result in results:
            if isinstance(result, Exception):
                logger.debug("WebSocket relay ended: %r", result)
