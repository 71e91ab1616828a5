"""Forwarding a request to a replica over the dispatcher, and relaying its answer to
the client: what the proxy does for every request its own process does not serve."""

from __future__ import annotations

import logging
import time

from starlette.types import Send

from app_toolkit._runtime.answers import internal_error, overloaded, replica_lost, send_answer, unavailable
from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.messages import (
    BodyChunk,
    HTTPRequest,
    HTTPResponse,
    HTTPResponseStart,
    ReplicaLost,
    StreamEnd,
)
from app_toolkit._runtime.proxy import stream_metrics
from app_toolkit._runtime.proxy.request_state import RequestState, abort_response
from app_toolkit._runtime.proxy.scope import with_request_id
from app_toolkit._runtime.routing.dispatcher import Dispatcher, OnOpen
from app_toolkit.exceptions import BackPressureError, ReplicaUnavailableError, RequestLostError

logger = logging.getLogger("app_toolkit.proxy")

#: RFC 9110's safe methods: a request of one whose replica was lost before it answered is
#: sent once more, to another replica (as nginx's proxy_next_upstream does); any other is
#: answered 502, since it may have run.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def forward(
    dispatcher: Dispatcher,
    request: HTTPRequest,
    send: Send,
    state: RequestState,
    model_id: str = "",
    shard_key: str = "",
    on_open: OnOpen | None = None,
) -> None:
    """Send ``request`` through ``dispatcher`` and relay the replica's answer to the client
    (a complete response in one write, a stream as it is produced); queue, overload and
    lost-replica failures are answered here. ``on_open``: see ``Dispatcher.send``."""
    request_id = request.request_id
    try:
        try:
            reply = await dispatcher.send(request, model_id, shard_key, on_open=on_open)
        except RequestLostError as exc:
            if request.more_body or request.scope.get("method") not in SAFE_METHODS:
                raise
            # Safe to repeat (read-only by contract), and the proxy holds it whole: once
            # more, to another replica (the lost one is out of the dispatcher's choice).
            logger.info("Request %s: %s; sending it again", request_id, exc)
            reply = await dispatcher.send(request, model_id, shard_key, on_open=on_open)
    except BackPressureError as exc:
        state.status = await send_answer(send, overloaded(exc, request_id))
        return
    except RequestLostError as exc:
        logger.warning("Request %s: %s (502)", request_id, exc)
        state.status = await send_answer(send, replica_lost(request_id))
        return
    except ReplicaUnavailableError as exc:
        logger.warning("Request %s: %s", request_id, exc)
        state.status = await send_answer(send, unavailable("no replica could serve the request", request_id))
        return
    try:
        first = reply.first
        if isinstance(first, HTTPResponse):
            await _respond(first, send, state, request_id)
        elif isinstance(first, HTTPResponseStart):
            await _stream(first, reply.exchange, send, state, request_id)
        else:  # not an HTTP answer: the replica could not take the request as sent
            logger.error("Request %s: the replica answered HTTP with %s", request_id, type(first).__name__)
            state.status = await send_answer(send, internal_error(request_id))
    finally:
        reply.exchange.cancel()
        reply.release()


async def _respond(response: HTTPResponse, send: Send, state: RequestState, request_id: str) -> None:
    """A complete response: its head and body leave in one write where the server lets us."""
    state.route = response.route
    state.started = state.finished = True
    state.status = response.status
    if state.link is not None:
        state.link.join_head_and_body()
    try:
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": with_request_id(response.headers, request_id),
            }
        )
        await send({"type": "http.response.body", "body": response.body})
    finally:
        if state.link is not None:
            state.link.release()


async def _stream(
    start: HTTPResponseStart, exchange: Exchange, send: Send, state: RequestState, request_id: str
) -> None:
    state.route = start.route
    state.started = True
    state.status = start.status
    await send(
        {
            "type": "http.response.start",
            "status": start.status,
            "headers": with_request_id(start.headers, request_id),
        }
    )
    stream_metrics.OPEN.inc(state.app, "stream")
    try:
        await _relay_stream(exchange, send, state, request_id)
    finally:
        stream_metrics.OPEN.dec(state.app, "stream")


async def _relay_stream(exchange: Exchange, send: Send, state: RequestState, request_id: str) -> None:
    """Send a streamed response's body chunks as the replica produces them, each as its
    own chunk (as the app sent it). A stream that fails (the app raised, or its replica
    was lost) aborts the connection: the client sees an incomplete body, never one that
    looks complete."""
    labels = (state.app, state.prefix + state.route if state.route else state.prefix)
    first = True
    while True:
        answer = await exchange.recv()
        if isinstance(answer, BodyChunk):
            chunks = [answer, *exchange.take_ready(BodyChunk)]
            last = exchange.next_is(StreamEnd)
            state.finished = last
            # Chunks that arrived together leave in one write to the client, each still
            # its own chunk.
            if state.link is not None:
                state.link.gather_writes()
            try:
                for index, chunk in enumerate(chunks):
                    more = not (last and index == len(chunks) - 1)
                    await send({"type": "http.response.body", "body": chunk.data, "more_body": more})
            finally:
                if state.link is not None:
                    state.link.release()
            if first:
                stream_metrics.FIRST_CHUNK.observe(time.perf_counter() - state.arrived, *labels)
                first = False
            stream_metrics.CHUNKS.inc(*labels, amount=len(chunks))
            if last:
                return
            continue
        if isinstance(answer, StreamEnd):
            state.finished = True
            await send({"type": "http.response.body", "body": b""})
            return
        why = "replica lost" if isinstance(answer, ReplicaLost) else "the app failed"
        logger.warning("Request %s: %s mid-stream; aborting the connection", request_id, why)
        await abort_response(state, why)
        return
