"""Direct ingress on Ray: the ingress replica owns its client connections (the node's
proxy hands them over), and every request that replica cannot serve itself still goes
where the proxy would send it."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import time
from typing import Any

import httpx
import pytest
import ray
from fastapi import APIRouter, Request
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

import app_toolkit as tk
from app_toolkit._runtime.backends.ray.cluster import NAMESPACE, PROXY_PREFIX
from tests import plain_http
from tests.apps.ray_only import make_where_app, where_router
from tests.conftest import LARGE_BODY_LIMIT, Toolkit
from tests.waiting import wait_for


def _owner(client: httpx.Client, prefix: str = "") -> dict[str, object]:
    response = client.get(f"{prefix}/owner")
    assert response.status_code == 200, response.text
    answer: dict[str, object] = response.json()
    return answer


def _fresh_owner(kit: Toolkit, prefix: str) -> dict[str, object]:
    """``_owner`` over a connection of its own."""
    with kit.client() as client:
        return _owner(client, prefix)


def _handed_off(kit: Toolkit, prefix: str, replicas: int) -> None:
    """Wait until new connections to ``prefix`` reach each of its ``replicas`` ingress
    replicas: the proxy hands them over once its tables list the replicas' hand-off
    addresses, and a replica keeps one once its own front has the app's routes; both may
    come a moment after ``tk.run`` returns (until then the proxy serves the connection
    itself, as the app's answers show)."""
    pids: set[object] = set()

    def each_replica_owns_one() -> bool:
        answer = _fresh_owner(kit, prefix)
        if answer["owns"]:
            pids.add(answer["pid"])
        return len(pids) == replicas

    wait_for(each_replica_owns_one, what=f"connections handed to each of {replicas} ingress replicas")


def test_the_ingress_replica_owns_the_client_connection(ray_toolkit: Toolkit) -> None:
    prefix = "/" + ray_toolkit.name()
    ray_toolkit.run(make_where_app(), route_prefix=prefix)
    _handed_off(ray_toolkit, prefix, replicas=2)
    with ray_toolkit.client() as client:  # one kept-alive connection
        first = _owner(client, prefix)
        second = _owner(client, prefix)
    assert first["owns"] is True and second == first
    # A fresh connection each time: each is handed to one of the two replicas.
    pids = set()
    for _ in range(12):
        answer = _fresh_owner(ray_toolkit, prefix)
        assert answer["owns"] is True
        pids.add(answer["pid"])
    assert len(pids) == 2
    metrics = plain_http.get(f"{ray_toolkit.url}/-/metrics", timeout=30).text
    assert "app_toolkit_proxy_connections_handed_off_total" in metrics


def test_an_application_can_keep_the_proxied_path(ray_toolkit: Toolkit) -> None:
    prefix = "/" + ray_toolkit.name()
    ray_toolkit.run(make_where_app(direct_ingress=False), route_prefix=prefix)
    with ray_toolkit.client() as client:
        assert _owner(client, prefix)["owns"] is False


def test_one_connection_serves_requests_of_two_applications(ray_toolkit: Toolkit) -> None:
    first, second = "/" + ray_toolkit.name(), "/" + ray_toolkit.name()
    ray_toolkit.run(make_where_app(num_replicas=1), route_prefix=first)
    ray_toolkit.run(make_where_app(num_replicas=1), route_prefix=second)
    _handed_off(ray_toolkit, first, replicas=1)
    _handed_off(ray_toolkit, second, replicas=1)  # the proxy's tables name the second app by now
    with ray_toolkit.client() as client:
        mine = _owner(client, first)  # the connection goes to the first app's replica
        theirs = _owner(client, second)  # forwarded by it to the second app's replica
        again = _owner(client, first)
        assert client.get(f"{second}/missing").status_code == 404
    assert mine["owns"] is True and again == mine
    assert theirs["owns"] is False and theirs["pid"] != mine["pid"]


slow_router = APIRouter()


@slow_router.get("/slow")
async def slow(seconds: float) -> dict[str, int]:
    import asyncio

    await asyncio.sleep(seconds)
    return {"pid": os.getpid()}


def test_a_replica_at_capacity_sends_requests_through_the_queue(ray_toolkit: Toolkit) -> None:
    prefix = "/" + ray_toolkit.name()
    ray_toolkit.run(tk.App(slow_router, max_ongoing_requests=1), route_prefix=prefix)
    started = time.monotonic()
    # Two connections, both handed to the one replica; it runs one request at a time,
    # so the second waits in the caller-side queue rather than running beside the first.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(
            pool.map(
                lambda _: plain_http.get(
                    f"{ray_toolkit.url}{prefix}/slow", params={"seconds": 0.5}, timeout=30
                ),
                range(2),
            )
        )
    assert [answer.status_code for answer in answers] == [200, 200]
    assert time.monotonic() - started >= 1.0


def test_a_killed_replicas_connections_and_new_ones_go_to_the_other(ray_toolkit: Toolkit) -> None:
    prefix = "/" + ray_toolkit.name()
    ray_toolkit.run(make_where_app(), route_prefix=prefix)
    _handed_off(ray_toolkit, prefix, replicas=2)
    clients = [ray_toolkit.client() for _ in range(8)]
    try:
        owners = [_owner(client, prefix)["pid"] for client in clients]
        assert len(set(owners)) == 2
        victim = owners[0]
        assert isinstance(victim, int)
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        # New connections are served by the survivor within a second.
        served = wait_for(
            lambda: _fresh_request(ray_toolkit.url + prefix + "/owner"),
            timeout_s=10,
            what="a new connection served",
        )
        assert time.monotonic() - killed_at < 1.0 + 0.5  # 0.5 s of slack for this busy machine
        assert served["pid"] != victim
        # A client of the dead replica keeps its kept-alive connection (the proxy holds a
        # copy of it): its next request is served by the other replica.
        for client, pid in zip(clients, owners, strict=True):
            answer = _owner(client, prefix)["pid"]
            assert answer == pid if pid != victim else answer != victim
    finally:
        for client in clients:
            client.close()


def test_a_websocket_whose_replica_dies_before_its_handshake_is_answered_gets_502(
    ray_toolkit: Toolkit,
) -> None:
    """The proxy holds a copy of the handed connection: with nothing of the handshake's
    answer sent, the client gets a 502, not a connection closed without a response."""
    prefix = "/" + ray_toolkit.name()
    ray_toolkit.run(make_where_app(num_replicas=1), route_prefix=prefix)
    _handed_off(ray_toolkit, prefix, replicas=1)
    url = ray_toolkit.url.replace("http://", "ws://") + prefix + "/held-socket"

    def handshake() -> int:
        try:
            with connect(url, open_timeout=30):
                return 101
        except InvalidStatus as exc:
            return exc.response.status_code

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(handshake)
        held = wait_for(
            lambda: _held_by(f"{ray_toolkit.url}{prefix}/held-sockets"),
            what="the handshake held by the ingress replica",
        )
        os.kill(held, signal.SIGKILL)
        assert answer.result(timeout=30) == 502


def _held_by(url: str) -> int | None:
    """The pid of the process holding a ``/held-socket`` handshake, if one does yet."""
    found = _fresh_request(url)
    return found["pid"] if found and found["held"] and isinstance(found["pid"], int) else None


def _fresh_request(url: str) -> dict[str, object] | None:
    try:
        response = plain_http.get(url, timeout=2)
    except httpx.TransportError:
        return None
    return response.json() if response.status_code == 200 else None


def test_a_connection_that_never_sends_is_closed(ray_toolkit: Toolkit) -> None:
    prefix = "/" + ray_toolkit.name()
    ray_toolkit.run(make_where_app(num_replicas=1), route_prefix=prefix)
    host, port = ray_toolkit.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as quiet:
        started = time.monotonic()
        assert quiet.recv(1) == b""
        assert time.monotonic() - started < 15


upload_router = APIRouter()
upload_router.include_router(where_router)  # /owner: whether the connection was handed over


@upload_router.post("/upload")
async def upload(request: Request) -> dict[str, int]:
    """Reads the body as it arrives; answers its size and this process's peak RSS."""
    size = 0
    async for piece in request.stream():
        size += len(piece)
    return {"size": size, "pid": os.getpid(), "peak_kb": _peak_kb(os.getpid())}


def _peak_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "proxied"])
def test_a_1_gib_upload_streams_into_the_app(ray_toolkit: Toolkit, direct: bool) -> None:
    prefix = "/" + ray_toolkit.name()
    ray_toolkit.run(tk.App(upload_router, direct_ingress=direct), route_prefix=prefix)
    if direct:  # the proxy must not be holding the connection the body goes through
        _handed_off(ray_toolkit, prefix, replicas=1)
    # Any: ray types actor methods as Never.
    proxy: Any = ray.get_actor(PROXY_PREFIX + ray.get_runtime_context().get_node_id(), namespace=NAMESPACE)
    proxy_pid = ray.get(proxy.stats.remote())["pid"]
    with ray_toolkit.client() as client:
        before = client.post(f"{prefix}/upload", content=b"x").json()
        proxy_before = _peak_kb(proxy_pid)
        piece = b"x" * (1 << 20)
        size = 1 << 30  # under max_request_body_bytes (2 GiB in the test session)
        answer = client.post(f"{prefix}/upload", content=(piece for _ in range(size >> 20))).json()
    grew_kb, proxy_grew_kb = answer["peak_kb"] - before["peak_kb"], _peak_kb(proxy_pid) - proxy_before
    print(f"1 GiB upload: replica peak RSS +{grew_kb >> 10} MiB, proxy +{proxy_grew_kb >> 10} MiB")
    assert answer["size"] == size and answer["pid"] == before["pid"]
    assert grew_kb < 64 << 10  # KiB: the replica never held the body
    # Direct: the proxy never saw the body; proxied: it held a piece at a time.
    assert proxy_grew_kb < (16 if direct else 64) << 10
    # A body declared larger than max_request_body_bytes: 413 before the app reads it.
    host, port = ray_toolkit.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        declared = LARGE_BODY_LIMIT + 1
        raw.sendall(
            f"POST {prefix}/upload HTTP/1.1\r\nhost: x\r\ncontent-length: {declared}\r\n\r\n".encode()
            + b"x" * 1000
        )
        assert raw.recv(100).startswith(b"HTTP/1.1 413 ")
