"""FastAPI behaves as under plain uvicorn, through the proxy, on both backends."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest
from websockets.sync.client import connect

import app_toolkit as tk
from tests.apps import basic
from tests.conftest import Toolkit
from tests.deployments import as_deployment
from tests.waiting import wait_for_async


def test_routes_validation_and_errors(toolkit: Toolkit) -> None:
    toolkit.run(basic.make_app(), route_prefix="/shop")
    with toolkit.client() as client:
        ok = client.get("/shop/items/7", params={"tag": "new"})
        assert ok.status_code == 200
        assert ok.json() == {"item_id": 7, "tag": "NEW"}
        assert ok.headers["x-middleware"] == "yes"

        created = client.post("/shop/items", json={"name": "pen", "price": 1.5})
        assert created.json() == {"name": "pen", "price": 1.5}

        invalid = client.post("/shop/items", json={"name": "pen"})
        assert invalid.status_code == 422
        assert invalid.json()["detail"][0]["loc"] == ["body", "price"]
        assert client.get("/shop/items/not-a-number").status_code == 422

        assert client.get("/shop/forbidden").json() == {"detail": "no entry"}
        assert client.get("/shop/forbidden").status_code == 403
        teapot = client.get("/shop/teapot")
        assert (teapot.status_code, teapot.json()) == (418, {"detail": "I am a teapot"})

        assert client.get("/shop/no-such-route").status_code == 404
        outside = client.get("/elsewhere")
        assert outside.status_code == 404
        assert outside.json()["request_id"] == outside.headers["x-request-id"]
        # Which path no application serves, as Ray Serve's answer says (in our JSON shape).
        assert "Path '/elsewhere' not found" in outside.json()["detail"]  # Ray Serve's own test checks this


def test_user_exception_is_generic_500_and_replica_keeps_serving(toolkit: Toolkit) -> None:
    toolkit.run(basic.make_app(), route_prefix="/err")
    with toolkit.client() as client:
        failed = client.get("/err/boom")
        assert failed.status_code == 500
        # Ray Serve's body, and the id to find the traceback by in the replica's log.
        assert failed.text == "Internal Server Error" and failed.headers["x-request-id"]
        assert "secret internals" not in failed.text and "Traceback" not in failed.text
        assert client.get("/err/items/1").status_code == 200


def test_request_id_is_honoured_or_created(toolkit: Toolkit) -> None:
    toolkit.run(basic.make_app(), route_prefix="/rid")
    with toolkit.client() as client:
        given = client.get("/rid/state", headers={"x-request-id": "req-42"})
        assert given.headers["x-request-id"] == "req-42"
        assert given.json()["request_id"] == "req-42"
        made = client.get("/rid/state")
        assert len(made.headers["x-request-id"]) == 32
        assert made.json()["request_id"] == made.headers["x-request-id"]
        # An unusable id (too long) is replaced, and the app reads the replacement too.
        replaced = client.get("/rid/state", headers={"x-request-id": "x" * 300})
        assert len(replaced.headers["x-request-id"]) == 32
        assert replaced.json()["request_id"] == replaced.headers["x-request-id"]
        # The app's headers are the client's as sent: the long id, no id it never sent.
        assert ["x-request-id", "x" * 300] in replaced.json()["headers"]
        assert "x-request-id" not in dict(made.json()["headers"])


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "proxied"])
def test_the_app_sees_exactly_the_headers_its_client_sent(toolkit: Toolkit, direct: bool) -> None:
    toolkit.run(basic.make_app(direct_ingress=direct), route_prefix="/sent")
    sent = [
        ("host", "example.test"),
        ("accept", "*/*"),
        ("x-custom", "One"),
        ("x-custom", "two"),  # repeated, in order
        ("traceparent", "00-not-a-valid-one"),  # malformed: still what the client sent
        ("tracestate", "k=v"),
    ]
    host, port = toolkit.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        head = "".join(f"{name}: {value}\r\n" for name, value in sent)
        raw.sendall(f"GET /sent/state HTTP/1.1\r\n{head}connection: close\r\n\r\n".encode())
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 200 ")
    seen = json.loads(body)
    assert seen["headers"] == [[name, value] for name, value in [*sent, ("connection", "close")]]
    assert len(seen["request_id"]) == 32  # made for it, and readable with get_request_id()

    ws_url = toolkit.url.replace("http://", "ws://") + "/sent/state"
    with connect(ws_url, additional_headers=[("x-custom", "One"), ("x-custom", "two")]) as websocket:
        seen = json.loads(websocket.recv(timeout=30))
        assert websocket.request is not None  # the handshake it sent
        handshake = [[name.lower(), value] for name, value in websocket.request.headers.raw_items()]
    assert seen["headers"] == handshake and ["x-custom", "two"] in handshake
    assert len(seen["request_id"]) == 32


def test_lifespan_state_and_request_state_on_every_replica(toolkit: Toolkit) -> None:
    toolkit.run(basic.make_app(num_replicas=2), route_prefix="/life")
    seen = set()
    for _ in range(60):
        # A new connection each time: on Ray each is served by the replica it is handed to.
        with toolkit.client() as client:
            data = client.get("/life/state").json()
        assert data["middleware"] is True
        assert data["root_path"] == "/life"
        seen.add(data["replica"])
        if len(seen) == 2:
            break
    # Each replica ran the lifespan once (its own token) and both received traffic.
    assert len(seen) == 2


def test_openapi_and_docs_under_route_prefix(toolkit: Toolkit) -> None:
    toolkit.run(basic.make_app(), route_prefix="/api/v1")
    with toolkit.client() as client:
        schema = client.get("/api/v1/openapi.json")
        assert schema.status_code == 200
        assert "/items/{item_id}" in schema.json()["paths"]
        # No "example": {} from a copied "not given" marker (the Ray backend pickles the app).
        assert '"example"' not in schema.text
        docs = client.get("/api/v1/docs")
        assert docs.status_code == 200
        assert "/api/v1/openapi.json" in docs.text
        # Swagger UI and ReDoc come from the app itself, not a CDN: they work offline.
        redoc = client.get("/api/v1/redoc")
        assert redoc.status_code == 200 and "fonts.googleapis" not in redoc.text
        for page, asset, kind in (
            (docs, "swagger-ui-bundle.js", "text/javascript"),
            (docs, "swagger-ui.css", "text/css"),
            (redoc, "redoc.standalone.js", "text/javascript"),
        ):
            assert f'"/api/v1/docs/assets/{asset}"' in page.text and "cdn." not in page.text
            served = client.get(f"/api/v1/docs/assets/{asset}")
            assert served.status_code == 200 and served.headers["content-type"].startswith(kind)
            assert len(served.content) > 10_000
        assert client.get("/api/v1/docs/assets/../openapi.json").status_code == 404
        assert client.get("/api/v1/docs/assets/secret.py").status_code == 404


def test_docs_from_a_cdn_when_asked(toolkit: Toolkit) -> None:
    toolkit.run(basic.make_app(offline_docs=False), route_prefix="/cdn")
    with toolkit.client() as client:
        docs = client.get("/cdn/docs")
        assert docs.status_code == 200 and "cdn.jsdelivr.net" in docs.text
        assert client.get("/cdn/docs/assets/swagger-ui.css").status_code == 404


def test_longest_route_prefix_wins(toolkit: Toolkit) -> None:
    root_name, nested_name = toolkit.name(), toolkit.name()
    toolkit.run(as_deployment(basic.Plain).bind(), name=root_name, route_prefix="/")
    toolkit.run(basic.make_app(), name=nested_name, route_prefix="/shop")
    with toolkit.client() as client:
        assert client.get("/shop/items/1").json()["item_id"] == 1
        # "/shopping" is not below "/shop": it belongs to the root app.
        assert client.get("/shopping").json() == {"path": "/shopping", "who": ""}
        assert client.get("/anything/else").json()["path"] == "/anything/else"
        routes = client.get("/-/routes").json()
        assert routes["/"] == root_name and routes["/shop"] == nested_name
        assert client.get("/-/healthz").json() == {"status": "ok"}


def test_plain_deployments_serve_http(toolkit: Toolkit) -> None:
    toolkit.run(as_deployment(basic.Plain).bind(), route_prefix="/plain")
    toolkit.run(basic.plain_text.bind(), route_prefix="/text")
    with toolkit.client() as client:
        assert client.get("/plain/x", params={"who": "me"}).json() == {"path": "/plain/x", "who": "me"}
        text = client.get("/text", params={"who": "you"})
        assert text.text == "plain you"
        assert text.headers["content-type"].startswith("text/plain")


def test_backpressure_gives_503_with_retry_after(toolkit: Toolkit, tmp_path: Path) -> None:
    toolkit.run(basic.make_app(max_ongoing_requests=1, max_queued_requests=1), route_prefix="/bp")
    running = tmp_path / "running"

    async def burst() -> list[int]:
        async with toolkit.async_client() as client:
            first = asyncio.ensure_future(
                client.get("/bp/sleep", params={"seconds": 2, "marker": str(running)})
            )
            # The first request holds the only slot.
            await wait_for_async(running.exists, 20, "the first request to run", interval_s=0.02)
            # One of these two takes the only queue place, the other is refused.
            second, third = await asyncio.gather(
                client.get("/bp/sleep", params={"seconds": 0}), client.get("/bp/sleep", params={"seconds": 0})
            )
            refused = second if second.status_code == 503 else third
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["request_id"] == refused.headers["x-request-id"]
            assert "unavailable" in refused.text  # the word Ray Serve's tests look for
            return sorted([(await first).status_code, second.status_code, third.status_code])

    assert asyncio.run(burst()) == [200, 200, 503]


def test_delete_makes_routes_404(toolkit: Toolkit) -> None:
    name = toolkit.name()
    toolkit.run(basic.make_app(num_replicas=2), name=name, route_prefix="/gone")
    app_status = tk.status().applications[name]
    assert app_status.status is tk.ApplicationStatus.RUNNING
    assert app_status.deployments["Ingress"].replica_states == {"RUNNING": 2}
    with toolkit.client() as client:
        assert client.get("/gone/items/1").status_code == 200
        tk.delete(name)
        assert client.get("/gone/items/1").status_code == 404
    assert name not in tk.status().applications
