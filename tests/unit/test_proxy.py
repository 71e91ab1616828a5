"""The proxy's own answers, driven as an ASGI app (no replicas, no sockets)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from app_toolkit._runtime import request_context, tracing
from app_toolkit._runtime.front.http_front import HTTPFront
from app_toolkit._runtime.front.path_match import AppMatcher, match_app
from app_toolkit._runtime.front.scope import forward_in_place, forwarded_copy, read_headers
from app_toolkit._runtime.messages import DeploymentID, RouteInfo
from app_toolkit._runtime.tables import ApplicationTable
from app_toolkit.config import HTTPOptions
from tests.unit.scopes import linked

pytestmark = pytest.mark.anyio


class NoReplicas:
    """A subscriber with one route and a dispatcher that must never be used."""

    def watch(self, key: str, apply: Callable[[Any], None]) -> asyncio.Event:
        apply(ApplicationTable((RouteInfo("/app", "app", DeploymentID("app", "Ingress")),)))
        return asyncio.Event()

    def dispatcher(self, deployment: DeploymentID) -> Any:
        return None


async def test_bodies_over_the_limit_get_413_before_any_replica_is_asked() -> None:
    proxy = HTTPFront(NoReplicas(), HTTPOptions(max_request_body_bytes=10))  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=linked(proxy))
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
    # The toolkit's own pages are no app's, not even the root app's (HTTP and WebSocket).
    assert match_app(routes, "/-/healthz") is None and match_app(routes, "/-x").route_prefix == "/"  # type: ignore[union-attr]


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
    proxy = HTTPFront(subscriber, HTTPOptions())  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=linked(proxy))
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        for path in ("/-/healthz", "/app/items/1", "/-/routes"):
            response = await client.get(path)
            assert response.status_code == 503 and response.headers["retry-after"] == "1", path
            assert "not loaded its routes yet" in response.json()["detail"]
        assert subscriber.apply is not None
        subscriber.apply(ApplicationTable((RouteInfo("/app", "app", DeploymentID("app", "Ingress")),)))
        assert (await client.get("/-/healthz")).status_code == 200
        assert (await client.get("/elsewhere")).status_code == 404


async def test_a_leaving_nodes_proxy_answers_healthz_503_and_still_serves() -> None:
    proxy = HTTPFront(NoReplicas(), HTTPOptions())  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=linked(proxy))
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        assert (await client.get("/-/healthz")).status_code == 200
        proxy.leaving = True  # Ray drains its node (backends/ray/proxies.py tells it)
        health = await client.get("/-/healthz")
        assert health.status_code == 503 and health.json()["status"] == "draining"
        assert (await client.get("/-/routes")).json() == {"/app": "app"}  # still serving


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


_ROUTE = AppMatcher(RouteInfo("/app", "app", DeploymentID("app", "Ingress")))
_VALID_PARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

#: A client's id and trace headers: whether its id is kept, whether its trace is continued.
SENT_IDS = pytest.mark.parametrize(
    ("sent", "kept_id", "kept_parent"),
    [
        ([], False, False),  # most requests: nothing to replace, the proxy's own added
        ([(b"x-request-id", b"mine")], True, False),
        ([(b"x-request-id", b"x" * 201)], False, False),  # too long: replaced, not doubled
        ([(b"traceparent", _VALID_PARENT), (b"tracestate", b"k=v")], False, True),
        ([(b"traceparent", b"00-bad"), (b"tracestate", b"k=v")], False, False),  # both go
    ],
)


@SENT_IDS
def test_the_app_sees_the_headers_its_client_sent_and_the_trace_travels_beside_them(
    sent: list[tuple[bytes, bytes]], kept_id: bool, kept_parent: bool
) -> None:
    client_headers = [(b"host", b"h"), *sent, (b"accept", b"*/*")]
    scope = {"type": "http", "root_path": "", "headers": list(client_headers)}
    headers = read_headers(scope)
    forwarded = forwarded_copy(scope)
    trace = forward_in_place(forwarded, _ROUTE, headers, None, id_headers=False) or tracing.new_trace()
    assert forwarded["headers"] == client_headers and forwarded["root_path"] == "/app"
    # The replica's span continues the client's valid traceparent, or one started here.
    assert (trace.traceparent.encode() == _VALID_PARENT) is kept_parent
    assert (trace.state == "k=v") is kept_parent
    assert tracing.parse(trace.traceparent) is not None
    in_place = dict(scope)  # direct ingress: the server's own scope, made the forwarded one
    continued = forward_in_place(in_place, _ROUTE, headers, None, id_headers=False)
    # In this process, a trace that starts here is made only if read (tracing.LazyTrace).
    assert (continued is None) is not kept_parent
    assert continued is None or continued.traceparent.encode() == _VALID_PARENT
    assert in_place["headers"] == client_headers and in_place["root_path"] == "/app"


@SENT_IDS
def test_with_request_id_headers_the_app_sees_one_request_id_and_one_traceparent(
    sent: list[tuple[bytes, bytes]], kept_id: bool, kept_parent: bool
) -> None:
    scope = {"type": "http", "root_path": "", "headers": [(b"host", b"h"), *sent, (b"accept", b"*/*")]}
    headers = read_headers(scope)
    forwarded = forwarded_copy(scope)
    trace = forward_in_place(forwarded, _ROUTE, headers, None, id_headers=True) or tracing.new_trace()
    names = [name for name, _ in forwarded["headers"]]
    assert names.count(b"x-request-id") == 1 and names.count(b"traceparent") == 1
    assert forwarded["root_path"] == "/app" and names[:1] == [b"host"] and b"accept" in names
    values = dict(forwarded["headers"])
    assert (values[b"x-request-id"] == b"mine") is kept_id
    assert values[b"x-request-id"].decode() == headers.request_id
    assert (values[b"traceparent"] == _VALID_PARENT) is kept_parent
    assert (b"tracestate" in values) is kept_parent  # an invalid traceparent voids its tracestate
    assert scope["headers"][1:-1] == sent  # the server's own scope is left as it was
    assert values[b"traceparent"] == trace.traceparent.encode()  # the one the replica continues
    in_place: dict[str, Any] = dict(scope)  # direct ingress: the trace it names is the one returned
    named = forward_in_place(in_place, _ROUTE, headers, None, id_headers=True)
    shown: dict[bytes, bytes] = dict(in_place["headers"])
    assert named is not None and shown[b"traceparent"] == named.traceparent.encode()


def test_a_new_trace_has_valid_distinct_ids_and_its_children_keep_its_trace_id() -> None:
    traces = [tracing.new_trace() for _ in range(200)]
    for trace in traces:
        assert re.fullmatch(r"[0-9a-f]{32}", trace.trace_id) and re.fullmatch(r"[0-9a-f]{16}", trace.span_id)
        assert tracing.parse(trace.traceparent) == (trace.trace_id, trace.span_id, "01")
        kid = tracing.child(trace)
        assert (kid.trace_id, kid.parent_id) == (trace.trace_id, trace.span_id)
        assert kid.span_id != trace.span_id
    assert len({trace.trace_id for trace in traces}) == 200 and len({t.span_id for t in traces}) == 200
    # Public (app_toolkit.tracing.current_trace() returns one): immutable and hashable.
    assert len(set(traces)) == 200
    with pytest.raises(dataclasses.FrozenInstanceError):
        traces[0].span_id = "0" * 16  # type: ignore[misc]


def test_a_lazy_trace_is_made_once_when_read_as_the_child_its_parent_would_have() -> None:
    parent = tracing.new_trace()
    lazy = tracing.LazyTrace(parent)
    made = lazy.read()
    assert lazy.read() is made  # once: every reader of the request sees the same span
    assert (made.trace_id, made.parent_id) == (
        parent.trace_id,
        parent.span_id,
    ) and made.span_id != parent.span_id
    # No parent: the trace started at the front (which exported and named nothing), so the
    # span has a parent span id, as one forwarded from the front has.
    started = tracing.LazyTrace(None).read()
    assert re.fullmatch(r"[0-9a-f]{16}", started.parent_id) and started.parent_id != started.span_id
    with request_context.request_scope("r1", tracing.LazyTrace(parent)):
        seen = tracing.current_trace()
        assert seen is not None and seen.parent_id == parent.span_id and tracing.current_trace() is seen
    assert tracing.current_trace() is None


def test_tracestate_lines_make_one_list_and_go_with_their_traceparent() -> None:
    sent = [(b"traceparent", _VALID_PARENT), (b"tracestate", b"a=1"), (b"tracestate", b"b=2")]
    caller = read_headers({"type": "http", "headers": sent}).caller
    assert caller is not None and caller.state == "a=1,b=2"
    # What the app sees when spans are exported: its replica's span and that trace's state.
    child = tracing.child(caller)
    shown = tracing.with_traceparent([(b"accept", b"*/*"), *sent], child)
    assert shown == [
        (b"accept", b"*/*"),
        (b"traceparent", child.traceparent.encode()),
        (b"tracestate", b"a=1,b=2"),
    ]
    started = tracing.new_trace()  # the client's traceparent was invalid: its state goes too
    bad = [(b"traceparent", b"00-bad"), (b"tracestate", b"a=1")]
    assert tracing.with_traceparent(bad, started) == [(b"traceparent", started.traceparent.encode())]
