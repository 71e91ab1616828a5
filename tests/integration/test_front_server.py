"""front/server.py outside Ray: a server whose connections our own listener accepts (as
the node's proxy does under direct ingress), stopped in order; and one whose listener
cannot be made, which lets its socket and task go."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from app_toolkit._runtime.front.server import Adopter, listen_socket, serve
from app_toolkit.config import HTTPOptions


async def _hello(scope: Scope, receive: Receive, send: Send) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


class _Accepting:
    """A listener that accepts on the event loop and passes each connection to the
    server's adopter; it records what the server told it."""

    def __init__(self, sock: socket.socket, adopt: Adopter) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.told: list[str] = []
        self._task = asyncio.ensure_future(self._accept(adopt))

    async def _accept(self, adopt: Adopter) -> None:
        loop = asyncio.get_running_loop()
        while True:
            connection, _ = await loop.sock_accept(self.sock)
            adopt(connection)

    def close(self) -> None:
        self.told.append("close")
        self._task.cancel()

    def stopped(self) -> None:
        self.told.append("stopped")
        self.sock.close()


@pytest.mark.anyio
async def test_connections_our_listener_accepts_are_served_and_it_is_stopped_in_order() -> None:
    http = HTTPOptions(host="127.0.0.1", port=0)
    sock = listen_socket("127.0.0.1", 0, exclusive=False)
    listeners: list[_Accepting] = []

    def listen(sock: socket.socket, adopt: Adopter) -> _Accepting:
        listeners.append(_Accepting(sock, adopt))
        return listeners[0]

    running = await serve(_hello, http, sock, listen=listen)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{running.port}", timeout=5) as client:
            answered = await client.get("/")
        assert (answered.status_code, answered.text) == (200, "hello")
    finally:
        await running.stop(5)
    assert listeners[0].told == ["close", "stopped"]
    assert running.task.done()


@pytest.mark.anyio
async def test_a_listener_that_cannot_be_made_lets_the_socket_and_the_server_go() -> None:
    http = HTTPOptions(host="127.0.0.1", port=0)
    sock = listen_socket("127.0.0.1", 0, exclusive=False)
    port = sock.getsockname()[1]
    tasks_before = asyncio.all_tasks()

    def listen(sock: socket.socket, adopt: Adopter) -> _Accepting:
        raise OSError("no listener today")

    with pytest.raises(OSError, match="no listener today"):
        await serve(_hello, http, sock, listen=listen)
    assert sock.fileno() == -1  # closed
    await asyncio.sleep(0)
    assert [t for t in asyncio.all_tasks() - tasks_before if not t.done()] == []
    with contextlib.closing(socket.socket()) as probe:  # nobody holds the port now
        probe.bind(("127.0.0.1", port))
