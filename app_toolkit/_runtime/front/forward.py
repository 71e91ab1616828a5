"""Forwarding a request to a replica over the dispatcher, and relaying its answer to
the client: what the proxy does for every request its own process does not serve."""

from __future__ import annotations

import logging

from app_toolkit._runtime.answers import bad_reply, overloaded, replica_lost, unavailable
from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.front.cycle import HTTPCycle
from app_toolkit._runtime.front.reply_check import BodyLength, checked
from app_toolkit._runtime.messages import (
    BodyChunk,
    CallFailure,
    HTTPRequest,
    HTTPResponse,
    HTTPResponseStart,
    ReplicaLost,
    StreamEnd,
)
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
    cycle: HTTPCycle,
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
        await cycle.answer(overloaded(exc, request_id))
        return
    except RequestLostError as exc:
        logger.warning("Request %s: %s (502)", request_id, exc)
        await cycle.answer(replica_lost(request_id))
        return
    except ReplicaUnavailableError as exc:
        logger.warning("Request %s: %s", request_id, exc)
        await cycle.answer(unavailable("no replica could serve the request", request_id))
        return
    try:
        first = reply.first
        length = checked(first, request.scope.get("method", ""))
        if isinstance(length, str):  # nothing went out yet: the replica's fault is a 502
            logger.error("Request %s: the replica's reply is malformed (%s); 502", request_id, length)
            await cycle.answer(bad_reply(request_id))
        elif isinstance(first, HTTPResponse):
            await cycle.whole(first.status, first.headers, first.body, first.route)
        elif isinstance(first, HTTPResponseStart):
            await cycle.stream(first.status, first.headers, first.route)
            await _relay_stream(reply.exchange, cycle, length)
    finally:
        cycle.stream_closed()
        reply.exchange.cancel()
        reply.release()


async def _relay_stream(exchange: Exchange, cycle: HTTPCycle, length: BodyLength) -> None:
    """Send a streamed response's body chunks as the replica produces them, each as its
    own chunk (as the app sent it). A stream that fails aborts the connection: the client
    sees an incomplete body, never one that looks complete."""
    why = await _relay_body(exchange, cycle, length)
    if why is not None:
        logger.warning("Request %s: %s mid-stream; aborting the connection", cycle.request_id, why)
        await cycle.abort(why)


async def _relay_body(exchange: Exchange, cycle: HTTPCycle, length: BodyLength) -> str | None:
    """Relay the body to its end (None), or until it fails: the app raised, its replica
    was lost, or its reply broke the channel's order or the ``length`` its head declared
    (why, and what broke it is not written)."""
    while True:
        answer = await exchange.recv()
        if isinstance(answer, BodyChunk):
            # Chunks that arrived together leave in one write to the client.
            chunks = [answer, *exchange.take_ready(BodyChunk)]
            last = exchange.next_is(StreamEnd)
            if length.left is not None:  # a declared length: the body keeps to it
                why = length.take(sum(len(chunk.data) for chunk in chunks)) or (
                    length.end() if last else None
                )
                if why is not None:
                    return why
            await cycle.chunks([chunk.data for chunk in chunks], last)
            if last:
                return None
            continue
        if isinstance(answer, StreamEnd):
            why = length.end()
            if why is None:
                await cycle.chunks((b"",), last=True)
            return why
        if isinstance(answer, ReplicaLost):
            return "replica lost"
        if isinstance(answer, CallFailure):
            return "the app failed"
        return f"{type(answer).__name__} in its body"
