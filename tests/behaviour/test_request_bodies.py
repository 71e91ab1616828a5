"""Request bodies on the proxied path (the proxy forwards each request to a replica):
the app reads a body as the client sends it, on both backends, and the proxy's bounds
still answer."""

from __future__ import annotations

import asyncio
import socket
import time

from fastapi import APIRouter, Request

import app_toolkit as tk
from tests import plain_http
from tests.conftest import LARGE_BODY_LIMIT, Toolkit
from tests.waiting import wait_for

router = APIRouter()
_seen: dict[str, list[int]] = {}  # upload name -> the sizes of the pieces the app read so far
_outcome: dict[str, str] = {}  # upload name -> what became of the app reading it


@router.post("/pieces/{name}")
async def pieces(name: str, request: Request) -> dict[str, list[int]]:
    sizes = _seen.setdefault(name, [])
    async for piece in request.stream():
        if piece:
            sizes.append(len(piece))
    return {"sizes": sizes}


@router.post("/held/{name}")
async def held(name: str, request: Request) -> dict[str, str]:
    """Reads the body; records whether it was cancelled before the body ended."""
    _outcome[name] = "reading"
    try:
        async for _ in request.stream():
            pass
    except asyncio.CancelledError:
        _outcome[name] = "cancelled"
        raise
    _outcome[name] = "read"
    return {"outcome": "read"}


@router.get("/outcome/{name}")
async def outcome(name: str) -> dict[str, str]:
    return {"outcome": _outcome.get(name, "")}


@router.get("/seen/{name}")
async def seen(name: str) -> dict[str, list[int]]:
    return {"sizes": _seen.get(name, [])}


def _proxied_app() -> tk.Application:
    # One replica, so the upload and the peeks at it meet in one process.
    return tk.App(router, num_replicas=1, direct_ingress=False)


def _connect(toolkit: Toolkit) -> socket.socket:
    host, port = toolkit.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def test_the_app_reads_a_forwarded_body_as_the_client_sends_it(toolkit: Toolkit) -> None:
    prefix = "/" + toolkit.name()
    toolkit.run(_proxied_app(), route_prefix=prefix)
    name = toolkit.name()
    with _connect(toolkit) as upload, toolkit.client() as client:
        upload.sendall(
            f"POST {prefix}/pieces/{name} HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n".encode()
            + _chunk(b"a" * 1000)
        )

        def the_app_has(count: int) -> bool:
            return len(client.get(f"{prefix}/seen/{name}").json()["sizes"]) >= count

        # The first piece reaches the app while the rest of the body is still with the client.
        wait_for(lambda: the_app_has(1), timeout_s=10, what="the app to read the first piece")
        upload.sendall(_chunk(b"b" * 2000))
        wait_for(lambda: the_app_has(2), timeout_s=10, what="the app to read the second piece")
        upload.sendall(_chunk(b"c" * 3000) + b"0\r\n\r\n")
        answer = b""
        while not answer.endswith(b"}"):
            data = upload.recv(65536)
            assert data, answer
            answer += data
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith(b'{"sizes":[1000,2000,3000]}')


def test_a_forwarded_body_over_the_limit_gets_413_midway(local_toolkit: Toolkit) -> None:
    # The local session keeps the default max_request_body_bytes (100 MiB); no length is
    # declared, so the proxy finds out while it streams the body to the app.
    prefix = "/" + local_toolkit.name()
    local_toolkit.run(_proxied_app(), route_prefix=prefix)
    name = local_toolkit.name()
    limit = tk.HTTPOptions().max_request_body_bytes
    piece = b"x" * (1 << 20)
    with local_toolkit.client() as client:
        started = time.monotonic()
        pieces = (piece for _ in range(limit // len(piece) + 8))
        refused = client.post(f"{prefix}/pieces/{name}", content=pieces)
        assert refused.status_code == 413, refused.text
        assert "max_request_body_bytes" in refused.json()["detail"]
        assert time.monotonic() - started < 60
        read = sum(client.get(f"{prefix}/seen/{name}").json()["sizes"])
        assert 0 < read <= limit  # the app got what came within the limit, and was stopped
        # The replica serves on.
        small = client.post(f"{prefix}/pieces/{local_toolkit.name()}", content=b"tiny")
        assert small.json() == {"sizes": [4]}
    assert plain_http.get(f"{local_toolkit.url}{prefix}/seen/{name}", timeout=30).status_code == 200


def test_a_client_still_sending_a_body_declared_too_large_reads_its_413(toolkit: Toolkit) -> None:
    """The 413 comes before the app reads anything, and the connection ends with a
    lingering close (front/linger.py): the body the client goes on sending is read and
    dropped, so the client reads the 413 and the end, not a reset."""
    prefix = "/" + toolkit.name()
    toolkit.run(_proxied_app(), route_prefix=prefix)
    declared = tk.HTTPOptions().max_request_body_bytes + 1
    if toolkit.backend == "ray":
        declared = LARGE_BODY_LIMIT + 1  # the Ray session's proxies take larger bodies
    with _connect(toolkit) as upload:
        upload.sendall(f"POST {prefix}/pieces/{toolkit.name()} HTTP/1.1\r\nhost: x\r\n".encode())
        upload.sendall(f"content-length: {declared}\r\n\r\n".encode())
        upload.sendall(b"x" * (4 << 20))  # on with the body, the 413 on its way meanwhile
        answer = b""
        while data := upload.recv(65536):
            answer += data
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"max_request_body_bytes" in answer and b"\r\nconnection: close\r\n" in answer.lower()


def test_a_client_that_leaves_mid_upload_cancels_the_app(toolkit: Toolkit) -> None:
    prefix = "/" + toolkit.name()
    toolkit.run(_proxied_app(), route_prefix=prefix)
    name = toolkit.name()
    with toolkit.client() as client:

        def outcome() -> str:
            answer: str = client.get(f"{prefix}/outcome/{name}").json()["outcome"]
            return answer

        with _connect(toolkit) as upload:
            upload.sendall(
                f"POST {prefix}/held/{name} HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\n".encode()
                + b"x" * 1000
            )
            wait_for(lambda: outcome() == "reading", timeout_s=10, what="the app to start reading")
        # The client is gone with 99 KB of the body unsent: the app is cancelled, not left waiting.
        wait_for(lambda: outcome() == "cancelled", timeout_s=10, what="the app to be cancelled")
        assert client.post(f"{prefix}/held/{toolkit.name()}", content=b"x" * 200_000).json() == {
            "outcome": "read"
        }
