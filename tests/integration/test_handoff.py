"""Connection hand-off (direct ingress) with real sockets: the request line read without
being consumed, connections passed over Unix sockets and back, the proxy's acceptor, and
a server that serves connections accepted elsewhere."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Iterator

import pytest
from starlette.types import Receive, Scope, Send

from app_toolkit._runtime.proxy.acceptor import Acceptor
from app_toolkit._runtime.proxy.handoff import HandoffListener, HandoffSender, request_target
from app_toolkit._runtime.proxy.server import ProxyServer, serve
from app_toolkit.config import HTTPOptions

pytestmark = pytest.mark.anyio

#: A client's connection and the server's end of it.
Pair = tuple[socket.socket, socket.socket]
#: The proxy's listening socket, what it served itself, what the replica got, the replica's socket.
Parts = tuple[socket.socket, list[socket.socket], list[socket.socket], HandoffListener]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    ("head", "path"),
    [
        (b"GET /a/b?x=1 HTTP/1.1\r\nhost: x\r\n\r\n", "/a/b"),
        (b"POST /caf%C3%A9 HTTP/1.0\r\n", "/café"),
        (b"GET http://example.test/app/x?q HTTP/1.1\r\n", "/app/x"),
        (b"GET http://example.test HTTP/1.1\r\n", "/"),
        (b"GET / HTTP/1.1\n", "/"),  # a bare LF ends the line too
        (b"GET /a/b HTTP/1.1", None),  # the line has not ended yet
        (b"GET /a HTTP/2.0\r\n", None),
        (b"OPTIONS * HTTP/1.1\r\n", None),
        (b"\x16\x03\x01\x02\x00\n", None),  # a TLS hello, not HTTP
    ],
)
def test_the_request_line_names_the_path(head: bytes, path: str | None) -> None:
    assert request_target(head) == path


@pytest.fixture
def tcp_pair() -> Iterator[Pair]:
    """A client's connection and the server's end of it, on 127.0.0.1."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server_end, _ = listener.accept()
    listener.close()
    client.settimeout(5)
    yield client, server_end
    client.close()
    server_end.close()


async def _until(condition: object, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.005)


class Ends:
    """A replica's hand-off socket and the proxy's sender, with what each adopted."""

    def __init__(self) -> None:
        self.at_replica: list[socket.socket] = []
        self.at_proxy: list[socket.socket] = []
        self.ready = True
        self.listener = HandoffListener(self.at_replica.append, lambda: self.ready)
        self.path = self.listener.start()
        self.sender = HandoffSender(self.at_proxy.append)

    def close(self) -> None:
        self.sender.close()
        self.listener.close()
        for sock in self.at_replica + self.at_proxy:
            sock.close()


@pytest.fixture
async def ends() -> AsyncIterator[Ends]:
    made = Ends()
    yield made
    made.close()


def _blocking(sock: socket.socket) -> socket.socket:
    sock.settimeout(5)
    return sock


async def test_a_connection_goes_to_the_replica_and_back(tcp_pair: Pair, ends: Ends) -> None:
    client, server_end = tcp_pair
    assert oct(os.stat(os.path.dirname(ends.path)).st_mode & 0o777) == "0o700"
    assert ends.sender.send(ends.path, server_end)
    server_end.close()  # the proxy's copy
    await _until(lambda: ends.at_replica)
    client.sendall(b"ping")
    assert _blocking(ends.at_replica[0]).recv(4) == b"ping"
    ends.at_replica[0].sendall(b"pong")
    assert client.recv(4) == b"pong"
    # Given back: the client's connection stays open and now reaches the proxy.
    assert ends.listener.give_back(ends.at_replica[0])
    ends.at_replica[0].close()
    await _until(lambda: ends.at_proxy)
    client.sendall(b"again")
    assert _blocking(ends.at_proxy[0]).recv(5) == b"again"
    ends.listener.close()
    assert not os.path.exists(ends.path)


async def test_a_draining_replica_sends_new_connections_back(tcp_pair: Pair, ends: Ends) -> None:
    client, server_end = tcp_pair
    assert ends.sender.send(ends.path, server_end)  # connects; the peer outlives the listener
    await _until(lambda: ends.at_replica)
    ends.listener.stop_listening()
    assert ends.sender.send(ends.path, server_end)
    server_end.close()
    await _until(lambda: ends.at_proxy)
    assert len(ends.at_replica) == 1  # the second came straight back
    assert HandoffSender(ends.at_proxy.append).send(ends.path, client) is False  # no new peer


async def test_a_replica_not_ready_sends_connections_back(tcp_pair: Pair, ends: Ends) -> None:
    _, server_end = tcp_pair
    ends.ready = False
    assert ends.sender.send(ends.path, server_end)
    await _until(lambda: ends.at_proxy)
    assert not ends.at_replica
    ends.ready = True
    assert ends.sender.send(ends.path, server_end)
    await _until(lambda: ends.at_replica)


async def test_a_replica_that_is_gone_takes_nothing(tcp_pair: Pair, ends: Ends) -> None:
    _, server_end = tcp_pair
    assert ends.sender.send(ends.path, server_end)
    ends.listener.close()  # the replica's process ends: its sockets close
    await asyncio.sleep(0.05)
    assert ends.sender.send(ends.path, server_end) is False
    assert ends.sender.send("/nonexistent/handoff", server_end) is False


class _Routes:
    def __init__(self, target: tuple[str, str] | None) -> None:
        self.target = target
        self.paths: list[str] = []

    def wanted(self) -> bool:
        return True

    def choose(self, path: str) -> tuple[str, str] | None:
        self.paths.append(path)
        return self.target


@pytest.fixture
async def acceptor_parts() -> AsyncIterator[Parts]:
    listen = socket.create_server(("127.0.0.1", 0))
    here: list[socket.socket] = []
    at_replica: list[socket.socket] = []
    listener = HandoffListener(at_replica.append)
    listener.start()
    yield listen, here, at_replica, listener
    listener.close()
    for sock in here + at_replica:
        sock.close()


async def test_the_acceptor_hands_off_by_the_first_request_line(
    acceptor_parts: Parts,
) -> None:
    listen, here, at_replica, listener = acceptor_parts
    routes = _Routes(("app", listener.path))
    sender = HandoffSender(here.append)
    acceptor = Acceptor(listen, here.append, routes, sender, wait_s=5, max_waiting=10)
    acceptor.start()
    try:
        with socket.create_connection(listen.getsockname()) as client:
            await asyncio.sleep(0.05)  # accepted; nothing sent yet: it waits
            assert not here and not at_replica
            client.sendall(b"GET /app/x HTTP/1.1\r\nhost: t\r\n\r\n")
            await _until(lambda: at_replica)
            # Nothing was consumed: the replica reads the whole request.
            assert _blocking(at_replica[0]).recv(100).startswith(b"GET /app/x HTTP/1.1\r\n")
        assert routes.paths == ["/app/x"] and not here
        routes.target = None  # no local replica of that app: served here
        with socket.create_connection(listen.getsockname()) as client:
            client.sendall(b"GET /other HTTP/1.1\r\n\r\n")
            await _until(lambda: here)
        with socket.create_connection(listen.getsockname()) as client:
            client.sendall(b"GET /split-req")  # no whole line in the first segment: served here
            await _until(lambda: len(here) == 2)
    finally:
        acceptor.close()
        sender.close()


async def test_the_acceptor_closes_a_connection_that_sends_nothing(
    acceptor_parts: Parts,
) -> None:
    listen, here, at_replica, listener = acceptor_parts
    sender = HandoffSender(here.append)
    routes = _Routes(("app", listener.path))
    acceptor = Acceptor(listen, here.append, routes, sender, wait_s=0.2, max_waiting=1)
    acceptor.start()
    try:
        with socket.create_connection(listen.getsockname()) as quiet:
            quiet.settimeout(5)
            await asyncio.sleep(0.05)
            assert not here  # it waits for its first bytes
            with socket.create_connection(listen.getsockname()):
                # One connection may wait (max_waiting): the next is served here at once.
                await _until(lambda: here)
            # After wait_s of silence the quiet one is closed, as an idle one would be.
            assert await asyncio.to_thread(quiet.recv, 1) == b""
        assert not at_replica and not routes.paths
    finally:
        acceptor.close()
        sender.close()


async def _hello(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
    await send({"type": "http.response.body", "body": b"hello"})


@pytest.fixture
async def front() -> AsyncIterator[ProxyServer]:
    server = await serve(_hello, HTTPOptions(), None)
    yield server
    await server.stop(timeout_s=5)


def _request(client: socket.socket) -> bytes:
    client.sendall(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
    answer = b""
    while not answer.endswith(b"hello"):  # the head and the body may come apart
        piece = client.recv(1000)
        if not piece:
            break
        answer += piece
    return answer


async def test_a_server_serves_a_connection_accepted_elsewhere_and_lets_it_go(
    front: ProxyServer, tcp_pair: Pair
) -> None:
    client, server_end = tcp_pair
    server_end.setblocking(False)
    front.adopt(server_end)
    answer = await asyncio.to_thread(_request, client)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello")
    await _until(lambda: front.connections())
    taken: list[socket.socket] = []

    def give(sock: socket.socket) -> bool:
        taken.append(socket.socket(fileno=os.dup(sock.fileno())))
        return True

    assert [connection.hand_back(give) for connection in front.connections()] == [True]
    await _until(lambda: not front.connections())
    # The client's connection was not closed: the next request reaches the new holder.
    client.sendall(b"GET /next HTTP/1.1\r\n\r\n")
    assert _blocking(taken[0]).recv(100).startswith(b"GET /next ")
    taken[0].close()


async def test_a_connection_in_the_middle_of_a_request_is_not_given_back(
    front: ProxyServer, tcp_pair: Pair
) -> None:
    client, server_end = tcp_pair
    server_end.setblocking(False)
    front.adopt(server_end)
    client.sendall(b"GET / HTTP/1.1\r\nhost: t\r\n")  # the head has not ended
    await _until(lambda: front.connections())
    await asyncio.sleep(0.05)
    assert [connection.hand_back(lambda sock: True) for connection in front.connections()] == [False]
