"""The upstream over the channel: a request or WebSocket sent through its deployment's
dispatcher to one of the app's replicas, which runs the app; the answer comes back and
is relayed to the client (``forward.py`` for HTTP; a WebSocket's messages both ways)."""

from __future__ import annotations

import asyncio
import logging

from app_toolkit._runtime import request_context, tracing
from app_toolkit._runtime.answers import ends_websocket
from app_toolkit._runtime.front.body import Body, BodyBudget, BodyPump, read_ahead
from app_toolkit._runtime.front.cycle import HTTPCycle
from app_toolkit._runtime.front.forward import forward
from app_toolkit._runtime.front.scope import forward_in_place, forwarded_copy
from app_toolkit._runtime.front.websocket import SocketCycle
from app_toolkit._runtime.messages import (
    CLOSE_INTERNAL_ERROR,
    HTTPRequest,
    StreamEnd,
    WebSocketMessage,
    WebSocketOpen,
)
from app_toolkit._runtime.routing.replica_client import Reply
from app_toolkit._runtime.routing.subscriber import TableSubscriber
from app_toolkit.exceptions import BackPressureError, ReplicaUnavailableError

logger = logging.getLogger("app_toolkit.proxy")

_APP_GRACE_S = 5.0  # how long an app may take to finish after its WebSocket client left


class ChannelUpstream:
    """Every application's replicas, reached through their dispatchers."""

    __slots__ = ("_subscriber", "budget")

    def __init__(self, subscriber: TableSubscriber, budget: BodyBudget) -> None:
        self._subscriber = subscriber
        self.budget = budget  # the bytes of bodies this process holds at once

    async def http(self, cycle: HTTPCycle) -> None:
        """Read the body's start, then forward the request to one of the app's replicas
        (the rest of the body is pumped after it)."""
        headers, route, deployment = cycle.headers, cycle.matched, cycle.deployment
        assert route is not None and deployment is not None  # the cycle runs apps' requests here
        body = Body()
        with request_context.request_scope(cycle.request_id):  # for this request's log records
            try:
                if headers.has_body and not await read_ahead(
                    body, cycle.reader, cycle.link, headers.content_length, self.budget
                ):
                    return  # refused on the reader: the cycle answers
                forwarded = forwarded_copy(cycle.scope)
                id_headers = cycle.http.request_id_headers
                trace = forward_in_place(forwarded, route, headers, cycle.span_trace, id_headers=id_headers)
                trace = trace or tracing.new_trace()  # the replica's span continues it
                request = HTTPRequest(
                    cycle.request_id, forwarded, body.data, body.more, trace.traceparent, trace.state
                )
                dispatcher = self._subscriber.dispatcher(deployment)
                if not body.more:
                    await forward(dispatcher, request, cycle, headers.model_id, headers.shard_key)
                    return
                async with BodyPump(cycle.reader, cycle.stop_for_body) as pump:
                    await forward(dispatcher, request, cycle, headers.model_id, headers.shard_key, pump.start)
            finally:
                self.budget.give(body.held)

    async def websocket(self, socket: SocketCycle) -> None:
        """Open the connection on one of the app's replicas and relay its messages."""
        route, deployment, headers = socket.matched, socket.deployment, socket.headers
        assert route is not None and deployment is not None
        forwarded = forwarded_copy(socket.scope)
        trace = forward_in_place(forwarded, route, headers, None, id_headers=socket.http.request_id_headers)
        trace = trace or tracing.new_trace()
        opening = WebSocketOpen(socket.request_id, forwarded, trace.traceparent, trace.state)
        try:
            reply = await self._subscriber.dispatcher(deployment).send(
                opening, headers.model_id, headers.shard_key
            )
        except BackPressureError:
            await socket.refuse("too many connections")
            return
        except ReplicaUnavailableError as exc:
            logger.warning("WebSocket %s: %s", socket.request_id, exc)
            await socket.refuse("no replica could serve the connection")
            return
        try:
            with socket.open():
                await _relay(reply, socket)
        finally:
            reply.exchange.cancel()
            reply.release()


async def _relay(reply: Reply, socket: SocketCycle) -> None:
    send, receive = socket.send, socket.receive

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
