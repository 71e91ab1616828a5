"""The proxy's listening socket: shared between proxies, never with a foreign server."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from app_toolkit._runtime.front.server import listen_socket


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def _foreign_listener(sockets: list[socket.socket]) -> int:
    """A plain server socket (no SO_REUSEPORT), like any other program's."""
    sock = socket.socket()
    sockets.append(sock)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return int(sock.getsockname()[1])


def test_proxies_share_a_port_and_the_kernel_spreads_connections(sockets: list[socket.socket]) -> None:
    first = listen_socket("127.0.0.1", 0, exclusive=True)
    sockets.append(first)
    port = first.getsockname()[1]
    second = listen_socket("127.0.0.1", port, exclusive=False)
    sockets.append(second)
    for sock in (first, second):
        sock.listen()
        sock.settimeout(0)
    accepted = {id(first): 0, id(second): 0}
    for _ in range(64):
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        sockets.append(client)
        for sock in (first, second):
            try:
                conn, _ = sock.accept()
            except BlockingIOError:
                continue
            sockets.append(conn)
            accepted[id(sock)] += 1
    assert sum(accepted.values()) == 64
    assert all(count > 0 for count in accepted.values()), accepted


def test_a_fresh_proxy_refuses_a_port_another_proxy_listens_on(sockets: list[socket.socket]) -> None:
    earlier = listen_socket("127.0.0.1", 0, exclusive=True)
    sockets.append(earlier)
    earlier.listen()
    port = earlier.getsockname()[1]
    with pytest.raises(OSError, match=rf"could not listen on 127.0.0.1:{port}.*--port"):
        listen_socket("127.0.0.1", port, exclusive=True)


@pytest.mark.parametrize("exclusive", [True, False])
def test_no_proxy_joins_a_foreign_server(sockets: list[socket.socket], exclusive: bool) -> None:
    port = _foreign_listener(sockets)
    with pytest.raises(OSError, match="is the port in use"):
        listen_socket("127.0.0.1", port, exclusive=exclusive)


def test_a_bad_host_says_so() -> None:
    with pytest.raises(OSError, match="cannot listen on host 'no-such-host.invalid'.*IP address"):
        listen_socket("no-such-host.invalid", 0, exclusive=True)
