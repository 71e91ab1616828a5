"""The proxy's own answers, driven as an ASGI app (no replicas, no sockets)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from app_toolkit._runtime.messages import DeploymentID, RouteInfo
from app_toolkit._runtime.proxy.path_match import AppMatcher, match_app
from app_toolkit._runtime.proxy.proxy import Proxy
from app_toolkit._runtime.proxy.scope import read_headers
from app_toolkit._runtime.tables import ApplicationTable
from app_toolkit.config import HTTPOptions

pytestmark = pytest.mark.anyio


class NoReplicas:
    """A subscriber with one route and a dispatcher that must never be used."""

    def watch(self, key: str, apply: Callable[[Any], None]) -> asyncio.Event:
        apply(ApplicationTable((RouteInfo("/app", "app", DeploymentID("app", "Ingress")),)))
        return asyncio.Event()

    def dispatcher(self, deployment: DeploymentID) -> Any:
        return None


async def test_bodies_over_the_limit_get_413_before_any_replica_is_asked() -> None:
    proxy = Proxy(NoReplicas(), HTTPOptions(max_request_body_bytes=10))  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=proxy)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        declared = await client.post("/app/upload", content=b"x" * 11)
        assert declared.status_code == 413
        assert "max_request_body_bytes" in declared.json()["detail"]

        async def chunks() -> Any:  # no Content-Length: counted while reading (the rest of
            yield b"12345678901"  # a body is streamed to the replica, and counted there)
            yield b"12345"

        streamed = await client.post("/app/upload", content=chunks())
        assert streamed.status_code == 413
        assert (await client.get("/elsewhere")).status_code == 404
        assert (await client.get("/-/routes")).json() == {"/app": "app"}


def test_longest_prefix_wins_and_prefixes_match_whole_segments() -> None:
    routes = [
        AppMatcher(RouteInfo(prefix, prefix, DeploymentID(prefix, "I"))) for prefix in ("/a/b", "/a", "/")
    ]
    assert match_app(routes, "/a/b/c").route_prefix == "/a/b"  # type: ignore[union-attr]
    assert match_app(routes, "/a/bc").route_prefix == "/a"  # type: ignore[union-attr]
    assert match_app(routes, "/ab").route_prefix == "/"  # type: ignore[union-attr]
    assert match_app(routes[:2], "/zzz") is None


class LateController:
    """A subscriber whose controller has not answered yet (a proxy restarted during an outage)."""

    def __init__(self) -> None:
        self.apply: Callable[[Any], None] | None = None

    def watch(self, key: str, apply: Callable[[Any], None]) -> asyncio.Event:
        self.apply = apply
        return asyncio.Event()

    def dispatcher(self, deployment: DeploymentID) -> Any:
        return None


async def test_until_the_routes_arrive_every_path_is_503_never_404() -> None:
    subscriber = LateController()
    proxy = Proxy(subscriber, HTTPOptions())  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=proxy)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        for path in ("/-/healthz", "/app/items/1", "/-/routes"):
            response = await client.get(path)
            assert response.status_code == 503 and response.headers["retry-after"] == "1", path
            assert "not loaded its routes yet" in response.json()["detail"]
        assert subscriber.apply is not None
        subscriber.apply(ApplicationTable((RouteInfo("/app", "app", DeploymentID("app", "Ingress")),)))
        assert (await client.get("/-/healthz")).status_code == 200
        assert (await client.get("/elsewhere")).status_code == 404


@pytest.mark.parametrize(
    ("headers", "has_body"),
    [
        ([], False),  # HTTP/1.1: no content-length and no transfer-encoding, no body
        ([(b"content-length", b"0")], False),
        ([(b"content-length", b"12")], True),
        ([(b"transfer-encoding", b"chunked")], True),
        ([(b"content-length", b"x")], True),  # malformed: read it, and let the checks answer
    ],
)
def test_only_a_request_that_declares_a_body_has_one_read(
    headers: list[tuple[bytes, bytes]], has_body: bool
) -> None:
    read = read_headers({"headers": headers})
    assert read.has_body is has_body
    assert len(read.request_id) == 32 and int(read.request_id, 16) >= 0  # made here: 128 random bits
