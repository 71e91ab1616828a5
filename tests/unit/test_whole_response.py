"""Our protocol's one writer (``wire_cycle.WireCycle``) puts on the wire exactly what
uvicorn's own ``RequestResponseCycle.send`` writes, and leaves the connection and the
cycle as it does, whether the app's ASGI messages or the front's whole response
(``RequestLink.whole``) or stream piece (``RequestLink.piece``) come to it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from uvicorn.server import ServerState

from app_toolkit._runtime.front.request_link import REQUEST_LINK, RequestLink
from app_toolkit._runtime.front.wire_cycle import WireCycle
from tests.unit.connections import KeptTransport, guarded, plain, served

Headers = list[tuple[bytes, bytes]]
#: How a response is given to the server: uvicorn's own cycle (ASGI messages), ours by
#: ASGI messages, ours through the request's link (what the front does).
WAYS = ("uvicorn", "asgi", "link")
#: The cycle's state after the exchange, compared between the ways.
STATE = ("response_started", "response_complete", "keep_alive", "chunked_encoding", "expected_content_length")


def _dated(day: int) -> list[tuple[bytes, bytes]]:
    return [(b"date", b"Fri, %d Nov 2026 05:00:00 GMT" % day), (b"server", b"uvicorn")]


async def _serve(way: str, request: bytes, status: int, headers: Headers, body: bytes) -> dict[str, Any]:
    """Serve ``request`` twice on one connection (a new date between the two), answered
    (``status``, ``headers``, ``body``) the ``way`` given; what the client got and what
    the app and the cycle saw."""
    seen: dict[str, Any] = {"linked": [], "raised": []}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            linked = False
            if way == "link":
                link = scope[REQUEST_LINK]
                assert isinstance(link, RequestLink)
                linked = link.whole(status, list(headers), body)
                seen["linked"].append(linked)
            if not linked:
                await send({"type": "http.response.start", "status": status, "headers": list(headers)})
                await send({"type": "http.response.body", "body": body})
        except Exception as exc:  # what the server refuses, it raises to the app
            seen["raised"].append(f"{type(exc).__name__}: {exc}")
            raise
        if scope["method"] == "POST":  # answered: no "100 Continue" is due any more
            seen["received"] = (await receive())["type"]

    state = ServerState()
    state.default_headers = _dated(26)
    protocol = plain(app, state) if way == "uvicorn" else guarded(app, state)
    transport = await served(
        protocol, request, times=2, between=lambda: setattr(state, "default_headers", _dated(27))
    )
    seen["written"] = bytes(transport.written)
    seen["writes"] = len(transport.writes)
    seen["closing"] = transport.closing
    seen["keep_alive_armed"] = protocol.timeout_keep_alive_task is not None
    seen["state"] = {name: getattr(protocol.cycle, name, None) for name in STATE}
    seen["cycle"] = type(protocol.cycle)
    protocol.connection_lost(None)
    return seen


GET = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
LENGTH_2: Headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]

#: (request, status, headers, body)
CASES: list[tuple[bytes, int, Headers, bytes]] = [
    (GET, 200, LENGTH_2, b"{}"),
    (GET, 404, [(b"content-length", b"0")], b""),
    (GET, 204, [(b"content-length", b"0")], b""),
    (GET, 304, [], b""),  # neither length nor chunks
    (GET, 200, [*LENGTH_2, (b"content-length", b"7")], b"{}"),  # the first one counts
    (GET, 200, [(b"x-content-length", b"7"), *LENGTH_2], b"{}"),  # another name
    (GET, 200, [*LENGTH_2, (b"x-note", b"caf\xc3\xa9\t: a=b, (c) content-length: 9")], b"{}"),
    (GET, 200, [(b"", b"empty name"), *LENGTH_2], b"{}"),
    (GET, 200, [(b"Content-Length", b"2"), (b"X-Upper", b"V")], b"{}"),  # written in lower case
    (GET, 200, [(b"content-type", b"text/plain")], b"{}"),  # no length: chunked
    (GET, 200, [(b"content-type", b"text/plain")], b""),
    (GET, 200, [*LENGTH_2, (b"transfer-encoding", b"chunked")], b"{}"),  # chunks after all
    (GET, 200, [(b"transfer-encoding", b"gzip"), (b"content-length", b"2")], b"{}"),
    (GET, 200, [(b"content-length", b"3")], b"{}"),  # shorter than said: refused
    (GET, 200, [(b"content-length", b"1")], b"{}"),  # longer than said: refused
    (GET, 200, [(b"content-length", b" 2")], b"{}"),
    (GET, 200, [(b"content-length", b"x")], b"{}"),
    (GET, 200, [*LENGTH_2, (b"connection", b"keep-alive, Close")], b"{}"),
    (GET, 200, [*LENGTH_2, (b"connection", b"upgrade")], b"{}"),
    (GET, 200, [*LENGTH_2, (b"x-bad", b"a\r\nb")], b"{}"),  # refused value
    (GET, 200, [*LENGTH_2, (b"x bad", b"a")], b"{}"),  # refused name
    (GET, 200, [*LENGTH_2, ("x-text", "not bytes")], b"{}"),  # type: ignore[list-item]
    (GET, 600, LENGTH_2, b"{}"),  # no status line for it
    (b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\n", 200, LENGTH_2, b"{}"),  # no body is written
    (b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\n", 200, [], b""),
    (b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n", 200, LENGTH_2, b"{}"),
    (b"GET / HTTP/1.0\r\n\r\n", 200, LENGTH_2, b"{}"),  # HTTP/1.0: closed after it
    (b"POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 3\r\n\r\nabc", 200, [], b"!"),
    (GET + GET, 200, LENGTH_2, b"{}"),  # pipelined: the second waits for the first
]


@pytest.mark.anyio
@pytest.mark.parametrize(("request_bytes", "status", "headers", "body"), CASES)
async def test_what_the_client_gets_is_what_uvicorn_writes(
    request_bytes: bytes, status: int, headers: Headers, body: bytes
) -> None:
    uvicorn_way, *ours = [await _serve(way, request_bytes, status, headers, body) for way in WAYS]
    for seen in ours:
        assert seen["cycle"] is WireCycle
        for key in ("written", "closing", "keep_alive_armed", "raised", "received"):
            assert seen.get(key) == uvicorn_way.get(key), key
        if not seen["raised"]:  # (a refused response's cycle is dropped with its connection)
            assert seen["state"] == uvicorn_way["state"]
    linked = ours[1]
    if not linked["raised"]:  # a response the front hands over: written at once, in one write
        assert linked["linked"] and all(linked["linked"])
        assert linked["writes"] == len(linked["linked"])


async def _stream(way: str, request: bytes, headers: Headers, pieces: list[bytes]) -> dict[str, Any]:
    """Serve a stream of ``pieces`` (then an empty last one) the ``way`` given."""
    seen: dict[str, Any] = {"linked": []}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": list(headers)})
        for piece in pieces:
            if way == "link" and scope[REQUEST_LINK].piece(piece):
                seen["linked"].append(True)
                continue
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    protocol = plain(app) if way == "uvicorn" else guarded(app)
    transport = await served(protocol, request)
    seen["written"] = bytes(transport.written)
    seen["state"] = {name: getattr(protocol.cycle, name, None) for name in STATE}
    protocol.connection_lost(None)
    return seen


#: (request, headers, pieces)
STREAMS: list[tuple[bytes, Headers, list[bytes]]] = [
    (GET, [(b"content-type", b"text/event-stream")], [b"data: 1\n\n", b"", b"data: 2\n\n"]),
    (GET, [(b"content-length", b"4")], [b"ab", b"cd"]),  # framed by its length
    (b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\n", [(b"transfer-encoding", b"chunked")], [b"ab"]),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("request_bytes", "headers", "pieces"), STREAMS)
async def test_a_streams_pieces_are_written_as_uvicorn_writes_them(
    request_bytes: bytes, headers: Headers, pieces: list[bytes]
) -> None:
    uvicorn_way, asgi, linked = [await _stream(way, request_bytes, headers, pieces) for way in WAYS]
    assert asgi["written"] == linked["written"] == uvicorn_way["written"]
    assert asgi["state"] == linked["state"] == uvicorn_way["state"]
    assert linked["linked"] == [True] * len(pieces)


@pytest.mark.anyio
async def test_a_response_that_started_or_ended_is_left_to_send() -> None:
    outcome: list[bool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        link = scope[REQUEST_LINK]
        outcome.append(link.piece(b"early"))  # nothing started: not a piece yet
        await send({"type": "http.response.start", "status": 200, "headers": LENGTH_2})
        outcome.append(link.whole(200, list(LENGTH_2), b"{}"))  # started already
        await send({"type": "http.response.body", "body": b"{}"})
        outcome.append(link.piece(b"late"))  # complete

    protocol = guarded(app)
    transport = await served(protocol, GET)
    assert outcome == [False, False, False]
    assert bytes(transport.written).endswith(b"\r\n\r\n{}")
    protocol.connection_lost(None)


@pytest.mark.anyio
async def test_after_the_client_left_nothing_is_written() -> None:
    asked, outcome = asyncio.Event(), []
    gone = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        asked.set()
        await gone.wait()
        outcome.append(scope[REQUEST_LINK].whole(200, list(LENGTH_2), b"{}"))
        await send({"type": "http.response.start", "status": 200, "headers": LENGTH_2})  # dropped
        await send({"type": "http.response.body", "body": b"{}"})
        outcome.append(True)

    protocol = guarded(app)
    transport = KeptTransport()
    protocol.connection_made(transport)
    protocol.data_received(GET)
    await asyncio.wait_for(asked.wait(), 5)
    protocol.connection_lost(None)
    gone.set()
    for _ in range(20):
        await asyncio.sleep(0)
    assert outcome == [False, True] and transport.written == b""
