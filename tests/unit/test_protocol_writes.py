"""Our protocol (``http_guard.py``, its writes through ``request_link.Writes``) puts on the
wire exactly what uvicorn's own protocol writes, and leaves the connection and the cycle
as it does: for the app's ASGI messages as they come, and for a complete response whose
head the front holds for its body (``RequestLink.join_head_and_body``), which then leaves
in one write."""

from __future__ import annotations

from typing import Any

import pytest
from uvicorn.server import ServerState

from app_toolkit._runtime.front.request_link import REQUEST_LINK, ConnectionLink
from tests.unit.connections import guarded, plain, served

Headers = list[tuple[bytes, bytes]]
#: How a response is given to the server: uvicorn's own protocol, ours, and ours with the
#: head held for the body (what the front's ``HTTPCycle.whole`` does).
WAYS = ("uvicorn", "asgi", "link")
#: The cycle's state after the exchange, compared between the ways.
STATE = ("response_started", "response_complete", "keep_alive", "chunked_encoding", "expected_content_length")


def _dated(day: int) -> Headers:
    return [(b"date", b"Fri, %d Nov 2026 05:00:00 GMT" % day), (b"server", b"uvicorn")]


async def _serve(way: str, request: bytes, status: int, headers: Headers, body: bytes) -> dict[str, Any]:
    """Serve ``request`` twice on one connection (a new date between the two), answered
    (``status``, ``headers``, ``body``) the ``way`` given; what the client got and what
    the app and the cycle saw."""
    seen: dict[str, Any] = {"linked": [], "raised": []}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        link = scope.get(REQUEST_LINK)
        if way == "link":
            assert isinstance(link, ConnectionLink)
            link.join_head_and_body()
            seen["linked"].append(True)
        try:
            await send({"type": "http.response.start", "status": status, "headers": list(headers)})
            await send({"type": "http.response.body", "body": body})
        except Exception as exc:  # what the server refuses, it raises to the app
            seen["raised"].append(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            if link is not None:
                link.release()
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
    seen["responses"] = bytes(transport.written).count(b"HTTP/1.1 ")
    seen["closing"] = transport.closing
    seen["keep_alive_armed"] = protocol.timeout_keep_alive_task is not None
    seen["state"] = {name: getattr(protocol.cycle, name, None) for name in STATE}
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
    (GET, 200, [*LENGTH_2, ("x-text", "not bytes")], b"{}"),  # type: ignore[list-item]  # on purpose: not bytes
    (GET, 200, [*LENGTH_2, (memoryview(b"x-view"), b"v")], b"{}"),  # type: ignore[list-item]  # on purpose
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
        for key in ("written", "closing", "keep_alive_armed", "raised", "received"):
            assert seen.get(key) == uvicorn_way.get(key), key
        if not seen["raised"]:  # (a refused response's cycle is dropped with its connection)
            assert seen["state"] == uvicorn_way["state"]
    linked = ours[1]
    if not linked["raised"]:  # a held head leaves with its body: one write per response
        assert linked["writes"] == len(linked["linked"]) == uvicorn_way["responses"]


async def _stream(way: str, request: bytes, headers: Headers, pieces: list[bytes]) -> dict[str, Any]:
    """Serve a stream of ``pieces`` (then an empty last one) on uvicorn's protocol or ours."""
    seen: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": list(headers)})
        for piece in pieces:
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
    uvicorn_way, ours = [await _stream(way, request_bytes, headers, pieces) for way in ("uvicorn", "asgi")]
    assert ours == uvicorn_way
