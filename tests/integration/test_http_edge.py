"""The proxy's HTTP server against hostile clients: raw sockets on 127.0.0.1 against the
real uvicorn server the proxy runs (docs/security.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.types import Receive, Scope, Send

from app_toolkit._runtime.front import linger
from app_toolkit._runtime.front.request_link import REQUEST_LINK
from app_toolkit._runtime.front.server import ProxyServer, listen_socket, serve
from app_toolkit.config import HTTPOptions

pytestmark = pytest.mark.anyio


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def start(**options: Any) -> ProxyServer:
    http = HTTPOptions(port=0, **options)
    return await serve(echo, http, listen_socket("127.0.0.1", 0, exclusive=True))


@pytest.fixture
async def opened() -> AsyncIterator[list[asyncio.StreamWriter]]:
    writers: list[asyncio.StreamWriter] = []
    yield writers
    for writer in writers:
        writer.close()


async def connect(
    port: int, opened: list[asyncio.StreamWriter]
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    opened.append(writer)
    return reader, writer


async def get(port: int, opened: list[asyncio.StreamWriter]) -> bytes:
    reader, writer = await connect(port, opened)
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    return await asyncio.wait_for(reader.read(), 5)


async def test_a_request_head_over_the_limit_gets_431_and_is_not_buffered(
    opened: list[asyncio.StreamWriter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client still sending its head reads the 431 and the end of the server's side
    (a lingering close: front/linger.py); what it sends on is read and dropped, never
    buffered, up to the linger's bound, and then the connection is closed."""
    monkeypatch.setattr(linger, "LINGER_BYTES", 4 << 20)
    server = await start(max_header_bytes=16384)
    try:
        reader, writer = await connect(server.port, opened)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (1 << 20))
        await writer.drain()
        assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 431 ")  # then the end
        sent = 0
        with pytest.raises(ConnectionError):  # closed while 50 MiB are still coming
            for _ in range(800):
                writer.write(b"a" * 65536)
                await writer.drain()
                sent += 65536
        # Closed long before the 50 MiB were sent: once it had read its bound (4 MiB here),
        # give or take what the two kernels' socket buffers took (a few MiB).
        assert sent < 16 << 20
        assert (await get(server.port, opened)).startswith(b"HTTP/1.1 200 ")
    finally:
        await server.stop(5)


async def test_a_refused_connection_lingers_only_while_the_client_sends(
    opened: list[asyncio.StreamWriter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 400 for bytes that do not parse: the client reads it and the end, while the bytes
    it goes on sending are dropped; once it pauses longer than a linger's read bound, the
    connection is closed."""
    monkeypatch.setattr(linger, "LINGER_READ_S", 0.5)
    server = await start()
    try:
        reader, writer = await connect(server.port, opened)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\x01bad\r\n\r\n")
        for _ in range(8):  # more of it, after the refusal was sent
            writer.write(b"b" * 65536)
            await writer.drain()
            await asyncio.sleep(0.05)
        answer = await asyncio.wait_for(reader.read(), 5)
        assert answer.startswith(b"HTTP/1.1 400 ") and answer.endswith(b"Invalid HTTP request received.")
        await asyncio.sleep(1.0)  # a pause beyond the bound: closed
        with pytest.raises(ConnectionError):
            for _ in range(20):
                writer.write(b"b")
                await writer.drain()
                await asyncio.sleep(0.05)
    finally:
        await server.stop(5)


async def test_heads_that_trickle_in_are_cut_off_while_other_clients_are_served(
    opened: list[asyncio.StreamWriter],
) -> None:
    server = await start(header_timeout_s=1)
    try:
        slow = [await connect(server.port, opened) for _ in range(300)]
        answers = [asyncio.ensure_future(reader.read(65536)) for reader, _ in slow]
        for _reader, writer in slow:
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nx-slow: ")
        started = time.monotonic()
        while time.monotonic() - started < 4:
            for _reader, writer in slow:
                if not writer.is_closing():
                    try:
                        writer.write(b"a")  # a byte at a time, never a whole head
                    except ConnectionError:
                        writer.close()
            assert (await get(server.port, opened)).startswith(b"HTTP/1.1 200 ")
            await asyncio.sleep(0.25)
        done = await asyncio.wait_for(asyncio.gather(*answers, return_exceptions=True), 5)
        closed = sum(isinstance(answer, bytes) and answer.startswith(b"HTTP/1.1 408 ") for answer in done)
        assert closed == 300, done[:3]
    finally:
        await server.stop(5)


async def test_a_connection_that_sends_nothing_is_closed_after_the_keep_alive_timeout(
    opened: list[asyncio.StreamWriter],
) -> None:
    server = await start(keep_alive_timeout_s=1)
    try:
        reader, _writer = await connect(server.port, opened)
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert time.monotonic() - started < 3
    finally:
        await server.stop(5)


async def test_connections_beyond_the_limit_get_503_with_retry_after(
    opened: list[asyncio.StreamWriter],
) -> None:
    server = await start(max_connections=3)
    try:
        for _ in range(3):
            await connect(server.port, opened)
        answer = await get(server.port, opened)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in answer
        for writer in opened[:3]:
            writer.close()
        await asyncio.sleep(0.2)
        assert (await get(server.port, opened)).startswith(b"HTTP/1.1 200 ")
    finally:
        await server.stop(5)


async def client_address(scope: Scope, receive: Receive, send: Send) -> None:
    body = f"{scope['client'][0]} {scope['scheme']}".encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


@pytest.mark.parametrize(
    ("trusted", "seen"), [("127.0.0.1", b"203.0.113.7 https"), ("10.9.9.9", b"127.0.0.1 http")]
)
async def test_forwarded_headers_count_only_from_trusted_addresses(
    opened: list[asyncio.StreamWriter], trusted: str, seen: bytes
) -> None:
    http = HTTPOptions(port=0, forwarded_allow_ips=trusted)
    server = await serve(client_address, http, listen_socket("127.0.0.1", 0, exclusive=True))
    try:
        reader, writer = await connect(server.port, opened)
        writer.write(
            b"GET / HTTP/1.1\r\nhost: x\r\nx-forwarded-for: 203.0.113.7\r\n"
            b"x-forwarded-proto: https\r\nconnection: close\r\n\r\n"
        )
        assert (await asyncio.wait_for(reader.read(), 5)).endswith(b"\r\n\r\n" + seen)
    finally:
        await server.stop(5)


async def joined(scope: Scope, receive: Receive, send: Send) -> None:
    """Sends its response as the proxy does: head and body joined through the request link."""
    link = scope[REQUEST_LINK]
    link.join_head_and_body()
    try:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        await send({"type": "http.response.body", "body": b"hello"})
    finally:
        link.release()


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_joined_responses_arrive_whole_on_a_kept_alive_connection(
    opened: list[asyncio.StreamWriter], method: str
) -> None:
    server = await serve(joined, HTTPOptions(port=0), listen_socket("127.0.0.1", 0, exclusive=True))
    try:
        reader, writer = await connect(server.port, opened)
        for _ in range(2):  # the same connection serves the next request after a HEAD too
            writer.write(f"{method} / HTTP/1.1\r\nhost: x\r\n\r\n".encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200 OK") and b"content-length: 5" in head
            if method == "GET":
                assert await asyncio.wait_for(reader.readexactly(5), 5) == b"hello"
    finally:
        await server.stop(5)
