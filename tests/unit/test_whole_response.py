"""A complete response written in one pass (``RequestLink.write_whole``) puts on the wire
exactly what uvicorn's two ``send`` calls would, and leaves the connection as they would;
what it does not cover, it leaves to them."""

from __future__ import annotations

from typing import Any

import pytest
from uvicorn.server import ServerState

from app_toolkit._runtime.front.request_link import REQUEST_LINK, RequestLink
from tests.unit.connections import guarded, served

Headers = list[tuple[bytes, bytes]]


async def _serve(
    request: bytes, status: int, headers: Headers, body: bytes, one_pass: bool
) -> dict[str, Any]:
    """Serve ``request`` twice on one connection with an app that answers
    (``status``, ``headers``, ``body``): in one pass where it may (``one_pass``), else by
    ASGI messages. Returns what the client got and what the app saw."""
    seen: dict[str, Any] = {"one_pass": [], "raised": []}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        link = scope[REQUEST_LINK]
        assert isinstance(link, RequestLink)
        if one_pass and link.write_whole(status, list(headers), body):
            seen["one_pass"].append(True)
            return
        seen["one_pass"].append(False)
        try:
            await send({"type": "http.response.start", "status": status, "headers": list(headers)})
            await send({"type": "http.response.body", "body": body})
        except Exception as exc:  # what uvicorn refuses, it raises to the app
            seen["raised"].append(type(exc).__name__)
            raise

    state = ServerState()
    state.default_headers = [(b"date", b"Fri, 27 Nov 2026 05:00:00 GMT"), (b"server", b"uvicorn")]
    protocol = guarded(app, state, log_level="critical")
    transport = await served(protocol, request, times=2)
    seen["written"] = bytes(transport.written)
    seen["closing"] = transport.closing
    seen["keep_alive_armed"] = protocol.timeout_keep_alive_task is not None
    protocol.connection_lost(None)
    return seen


GET = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
LENGTH_2: Headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]

#: (request, status, headers, body, written in one pass)
CASES: list[tuple[bytes, int, Headers, bytes, bool]] = [
    (GET, 200, LENGTH_2, b"{}", True),
    (GET, 404, [(b"content-length", b"0")], b"", True),
    (GET, 204, [(b"content-length", b"0")], b"", True),
    (GET, 200, [*LENGTH_2, (b"content-length", b"7")], b"{}", True),  # the first one counts
    (GET, 200, [*LENGTH_2, (b"x-note", b"caf\xc3\xa9\t: a=b, (c)")], b"{}", True),  # values may hold these
    (GET, 200, [(b"", b"empty name"), *LENGTH_2], b"{}", True),
    (GET, 200, [(b"Content-Length", b"2")], b"{}", False),  # uvicorn writes names in lower case
    (GET, 200, [*LENGTH_2, (b"X-Upper", b"V")], b"{}", False),
    (GET, 200, [(b"content-type", b"text/plain")], b"{}", False),  # no length: chunked
    (GET, 200, [(b"content-length", b"3")], b"{}", False),  # shorter than said: uvicorn raises
    (GET, 200, [(b"content-length", b"1")], b"{}", False),  # longer than said: uvicorn raises
    (GET, 200, [(b"content-length", b" 2")], b"{}", False),  # uvicorn's int() takes it
    (GET, 200, [(b"content-length", b"x")], b"{}", False),  # uvicorn's int() refuses it
    (GET, 200, [*LENGTH_2, (b"connection", b"close")], b"{}", False),
    (GET, 200, [(b"transfer-encoding", b"chunked")], b"{}", False),
    (GET, 200, [*LENGTH_2, (b"x-bad", b"a\r\nb")], b"{}", False),  # uvicorn refuses the value
    (GET, 200, [*LENGTH_2, (b"x bad", b"a")], b"{}", False),  # uvicorn refuses the name
    (GET, 200, [*LENGTH_2, ("x-text", "not bytes")], b"{}", False),  # type: ignore[list-item]
    (GET, 600, LENGTH_2, b"{}", False),  # uvicorn has no status line for it
    (b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\n", 200, LENGTH_2, b"{}", False),  # no body is written
    (b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n", 200, LENGTH_2, b"{}", False),
    (b"GET / HTTP/1.0\r\n\r\n", 200, LENGTH_2, b"{}", False),  # HTTP/1.0: closed after it
]


@pytest.mark.anyio
@pytest.mark.parametrize(("request_bytes", "status", "headers", "body", "one_pass"), CASES)
async def test_what_the_client_gets_is_what_uvicorn_writes(
    request_bytes: bytes, status: int, headers: Headers, body: bytes, one_pass: bool
) -> None:
    fast = await _serve(request_bytes, status, headers, body, one_pass=True)
    asgi = await _serve(request_bytes, status, headers, body, one_pass=False)
    assert fast["one_pass"] == [one_pass] * len(fast["one_pass"]) and fast["one_pass"]
    assert fast["written"] == asgi["written"]
    assert (fast["closing"], fast["keep_alive_armed"]) == (asgi["closing"], asgi["keep_alive_armed"])
    assert fast["raised"] == asgi["raised"]
    if one_pass:  # both requests were answered on the one connection, and it stays open
        assert fast["written"].count(b"HTTP/1.1 ") == 2 and not fast["closing"]


@pytest.mark.anyio
async def test_a_response_already_started_is_left_to_uvicorn() -> None:
    outcome: list[bool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": LENGTH_2})
        outcome.append(scope[REQUEST_LINK].write_whole(200, list(LENGTH_2), b"{}"))
        await send({"type": "http.response.body", "body": b"{}"})

    protocol = guarded(app, log_level="critical")
    transport = await served(protocol, GET)
    assert outcome == [False]
    assert bytes(transport.written).endswith(b"\r\n\r\n{}")
    protocol.connection_lost(None)


async def _stream(request: bytes, headers: Headers, pieces: list[bytes], one_pass: bool) -> dict[str, Any]:
    """Serve a stream of ``pieces`` (then an empty last one): its middle pieces in one
    pass where it may (``one_pass``), else by ASGI messages."""
    seen: dict[str, Any] = {"one_pass": []}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        link = scope[REQUEST_LINK]
        await send({"type": "http.response.start", "status": 200, "headers": list(headers)})
        for piece in pieces:
            written = one_pass and link.write_piece(piece)
            seen["one_pass"].append(written)
            if not written:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    protocol = guarded(app, log_level="critical")
    transport = await served(protocol, request)
    seen["written"] = bytes(transport.written)
    seen["complete"] = protocol.cycle.response_complete
    protocol.connection_lost(None)
    return seen


#: (request, headers, pieces, written in one pass)
STREAMS: list[tuple[bytes, Headers, list[bytes], bool]] = [
    (GET, [(b"content-type", b"text/event-stream")], [b"data: 1\n\n", b"", b"data: 2\n\n"], True),
    (GET, [(b"content-length", b"4")], [b"ab", b"cd"], False),  # not chunked: uvicorn counts
    (b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\n", [], [b"ab"], False),  # no body is written
]


@pytest.mark.anyio
@pytest.mark.parametrize(("request_bytes", "headers", "pieces", "one_pass"), STREAMS)
async def test_a_streams_pieces_are_written_as_uvicorn_writes_them(
    request_bytes: bytes, headers: Headers, pieces: list[bytes], one_pass: bool
) -> None:
    fast = await _stream(request_bytes, headers, pieces, one_pass=True)
    asgi = await _stream(request_bytes, headers, pieces, one_pass=False)
    assert fast["one_pass"] == [one_pass] * len(pieces)
    assert fast["written"] == asgi["written"] and fast["complete"] and asgi["complete"]
