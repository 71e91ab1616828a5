"""An ingress replica SIGKILLed while it holds client connections, on Ray, on both request
paths: no client sees a reset while the node's proxy lives (docs/fault-tolerance.md).

Kept-alive idle connections serve their next request elsewhere; responses under way end
with the connection closed, never with a terminating chunk. (Requests in flight and hung
replicas: test_faults.py.)"""

from __future__ import annotations

import os
import signal
import socket

import httpx
import pytest

from tests.apps.ray_only import make_where_app
from tests.conftest import Toolkit

#: Both request paths: the ingress replica owns the client's connection (direct, the
#: default), or the proxy serves it and forwards each request (direct_ingress=False).
PATHS = pytest.mark.parametrize("direct", [True, False], ids=["direct", "proxied"])
IDLE = 20


def _owner_pid(client: httpx.Client, prefix: str) -> int:
    response = client.get(f"{prefix}/owner")
    assert response.status_code == 200, response.text
    pid: int = response.json()["pid"]
    return pid


@PATHS
def test_idle_kept_alive_connections_serve_their_next_request_elsewhere(
    ray_toolkit: Toolkit, direct: bool
) -> None:
    prefix = "/" + ray_toolkit.name()
    ray_toolkit.run(make_where_app(direct_ingress=direct), route_prefix=prefix)
    # Kept-alive connections whose last request the victim served (on the direct path it
    # holds them; on the proxied one the proxy does).
    clients: list[httpx.Client] = []
    others: list[httpx.Client] = []
    try:
        with ray_toolkit.client() as probe:
            victim = _owner_pid(probe, prefix)
        while len(clients) < IDLE:
            assert len(clients) + len(others) < 200, "the victim never got its share of connections"
            client = ray_toolkit.client()
            (clients if _owner_pid(client, prefix) == victim else others).append(client)
        os.kill(victim, signal.SIGKILL)  # a replica process this test deployed
        for client in clients:  # each connection's next request: answered, by a live replica
            assert _owner_pid(client, prefix) != victim
    finally:
        for client in clients + others:
            client.close()


def _stream_until_closed(sock: socket.socket) -> tuple[bytes, str]:
    """Read a response until the server closes; returns what came and how it ended."""
    data = b""
    try:
        while piece := sock.recv(65536):
            data += piece
    except ConnectionResetError:
        return data, "reset"
    except TimeoutError:
        return data, "timeout"
    return data, "closed"


@PATHS
def test_responses_under_way_end_closed_without_a_last_chunk(ray_toolkit: Toolkit, direct: bool) -> None:
    prefix = "/" + ray_toolkit.name()
    ray_toolkit.run(make_where_app(num_replicas=1, direct_ingress=direct), route_prefix=prefix)
    host, port = ray_toolkit.url.removeprefix("http://").split(":")
    streams = [socket.create_connection((host, int(port)), timeout=30) for _ in range(2)]
    try:
        for stream in streams:
            stream.sendall(f"GET {prefix}/ticks HTTP/1.1\r\nhost: x\r\n\r\n".encode())
        heads = [_first_chunk(stream) for stream in streams]
        pids = {int(head.split(b"pid ", 1)[1].split(b"\n", 1)[0]) for head in heads}
        (victim,) = pids
        os.kill(victim, signal.SIGKILL)  # the replica process this test deployed
        for head, stream in zip(heads, streams, strict=True):
            rest, ending = _stream_until_closed(stream)
            assert ending == "closed", ending  # a FIN, not a reset, and no hang
            assert not (head + rest).endswith(b"0\r\n\r\n")  # no terminating chunk: it is cut
    finally:
        for stream in streams:
            stream.close()


def _first_chunk(sock: socket.socket) -> bytes:
    """The response so far, once its first chunk (the replica's pid) has come."""
    data = b""
    while b"pid " not in data or b"\n" not in data.split(b"pid ", 1)[1]:
        piece = sock.recv(65536)  # the socket's timeout bounds the wait
        assert piece, f"the stream ended before its first chunk: {data!r}"
        data += piece
    return data
