"""A request served by the proxy's HTTP protocol leaves nothing for the garbage collector:
everything it made is freed by reference counting when it ends. Objects left in reference
cycles are freed only by collections, which then walk them all (they cost the server about
a tenth of its throughput when every request left its scope and cycle in one)."""

from __future__ import annotations

import gc
import socket
from collections.abc import Iterator

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from app_toolkit._runtime.front.server import serve
from app_toolkit.config import HTTPOptions

pytestmark = pytest.mark.anyio


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):  # the body, as an app reads it
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def saved_garbage() -> Iterator[list[object]]:
    """What collections find from here on, kept for the test to look at."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


async def test_requests_leave_no_reference_cycles(saved_garbage: list[object]) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = await serve(app, HTTPOptions(), sock)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            for _ in range(20):  # one kept-alive connection
                assert (await client.get("/")).text == "ok"
                assert (await client.post("/", content=b"x" * 1000)).text == "ok"
            gc.collect()
    finally:
        await server.stop(timeout_s=5)
    left = {type(item).__name__ for item in saved_garbage}
    assert not left & {"RequestResponseCycle", "RequestLink", "HttpToolsProtocol"}, sorted(left)
