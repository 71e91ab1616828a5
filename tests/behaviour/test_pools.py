"""Per-route replica pools, route deadlines and the access log, on both backends."""

from __future__ import annotations

import functools
import logging
import time

import httpx
import pytest
from fastapi import APIRouter
from websockets.sync.client import connect

import app_toolkit as tk
from tests.apps import pools
from tests.conftest import Toolkit
from tests.waiting import wait_for


def test_pool_routes_run_in_their_own_deployments(toolkit: Toolkit) -> None:
    name = toolkit.name()
    toolkit.run(pools.make_app(), name=name, route_prefix="/p")
    with toolkit.client() as client:
        assert client.get("/p/api/health").json() == {"served_by": "Ingress"}
        item = client.get("/p/api/items/7", headers={"x-tenant": "acme"})
        assert item.json() == {"item_id": 7, "tenant": "acme", "served_by": "get_item"}
        assert item.headers["x-stamped-by"] == "get_item"  # the app's middleware ran there
        invalid = client.get("/p/api/items/seven")
        assert invalid.status_code == 422 and invalid.headers["x-stamped-by"] == "get_item"
        # FastAPI's order decides: /items/special is declared before /items/{item_id}.
        assert client.get("/p/api/items/special").json() == {"served_by": "Ingress"}
        assert client.post("/p/api/items/7").json() == {"updated": 7, "served_by": "Ingress"}
        with client.stream("GET", "/p/api/tokens/stream", params={"count": 3}) as events:
            lines = [line for line in events.iter_lines() if line.startswith("data:")]
        assert lines == [f"data: token {i} from streamer" for i in range(3)]
        failed = client.get("/p/api/boom")
        assert (failed.status_code, failed.text) == (500, "Internal Server Error")
        assert failed.headers["x-request-id"]
        assert client.get("/p/api/boom", params={"status": 418}).status_code == 418
        paths = set(client.get("/p/openapi.json").json()["paths"])
        assert {"/api/health", "/api/items/{item_id}", "/api/tokens/stream", "/api/slow"} <= paths
    with connect(toolkit.url.replace("http://", "ws://") + "/p/api/tokens/ws") as ws:
        ws.send("hi")
        assert ws.recv(timeout=10) == "hi via streamer"
    deployments = tk.status().applications[name].deployments
    assert set(deployments) == {"Ingress", "get_item", "streamer", "boomer"}
    assert deployments["get_item"].target_replicas == 2
    assert all(d.status is tk.DeploymentStatus.HEALTHY for d in deployments.values())


def test_route_deadline_and_header_deadline_return_504(toolkit: Toolkit) -> None:
    toolkit.run(pools.make_app(), route_prefix="/dl")
    with toolkit.client() as client:
        began = time.monotonic()
        late = client.get("/dl/api/slow")
        assert late.status_code == 504 and "0.5 s" in late.json()["detail"]
        assert time.monotonic() - began < 4
        assert client.get("/dl/api/slow", params={"seconds": 0.01}).json() == {"done": "yes"}
        # The header's deadline is earlier than the route's, so it wins.
        early = client.get(
            "/dl/api/slow", params={"seconds": 0.4}, headers={"x-request-timeout-seconds": "0.1"}
        )
        assert early.status_code == 504 and "0.1 s" in early.json()["detail"]


def test_two_routes_for_one_path_are_served_as_starlette_serves_them(
    toolkit: Toolkit, caplog: pytest.LogCaptureFixture
) -> None:
    by_id, by_name = APIRouter(), APIRouter()

    @by_id.get("/users/{user_id}")
    async def one(user_id: int) -> dict[str, object]:
        return {"by": "id", "user": user_id}

    @by_name.get("/users/{name}")
    @tk.replicated(num_replicas=1)  # a pool behind a hidden route changes nothing
    async def two(name: str) -> dict[str, object]:
        return {"by": "name", "user": name}

    with caplog.at_level(logging.WARNING, logger="app_toolkit"):
        toolkit.run(tk.App([by_id, by_name]), route_prefix="/dup")
    assert "GET /users/{name} (tests.behaviour.test_pools." in caplog.text
    assert "never runs" in caplog.text and "answers GET /users/{user_id} first" in caplog.text
    with toolkit.client() as client:
        assert client.get("/dup/users/7").json() == {"by": "id", "user": 7}
        # As under FastAPI: the first route matches the path, and its validation answers.
        refused = client.get("/dup/users/ann")
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["path", "user_id"]


def test_an_app_hiding_another_apps_routes_is_refused(toolkit: Toolkit) -> None:
    outer = APIRouter()

    @outer.get("/reports/{report_id}")
    async def report(report_id: int) -> dict[str, int]:
        return {"report": report_id}

    toolkit.run(tk.App(outer), route_prefix="/shadow")
    with pytest.raises(tk.ConfigError, match="would be hidden by application"):
        toolkit.run(tk.App(APIRouter()), route_prefix="/shadow/reports")
    with toolkit.client() as client:
        assert client.get("/shadow/reports/3").json() == {"report": 3}


def test_access_log_records_499_for_a_client_that_left(
    local_toolkit: Toolkit, caplog: pytest.LogCaptureFixture
) -> None:
    toolkit = local_toolkit  # the proxy runs in this process, so its log records are here
    caplog.set_level(logging.INFO, logger="app_toolkit.access")
    toolkit.run(pools.make_app(), route_prefix="/gone")

    def slow_lines(first: int = 0) -> list[str]:
        """The access lines of /gone/api/slow, from the ``first``."""
        lines = [r.getMessage() for r in caplog.records if r.name == "app_toolkit.access"]
        return [line for line in lines if '"GET /gone/api/slow HTTP/1.1"' in line][first:]

    # The client leaves 0.4 s before the route's 0.5 s deadline. On a loaded machine the
    # proxy may hear of it only after the deadline (a 504, also right): then it tries again.
    with toolkit.client() as client:
        for attempt in range(3):
            with pytest.raises(httpx.ReadTimeout):
                client.get("/gone/api/slow", timeout=0.1)
            ended = wait_for(functools.partial(slow_lines, attempt), 10, "the slow request's access line")
            assert '" 499 ' in ended[0] or '" 504 ' in ended[0], ended
            if '" 499 ' in ended[0]:
                break
        assert client.get("/gone/api/health").status_code == 200
    assert '" 499 ' in slow_lines()[-1], slow_lines()
    health = '"GET /gone/api/health HTTP/1.1" 200'
    wait_for(lambda: [r for r in caplog.records if health in r.getMessage()], 10, "the health line")


def test_the_access_log_escapes_what_the_client_chose(
    local_toolkit: Toolkit, caplog: pytest.LogCaptureFixture
) -> None:
    toolkit = local_toolkit
    caplog.set_level(logging.INFO, logger="app_toolkit.access")
    toolkit.run(pools.make_app(), route_prefix="/esc")
    forged = '/esc/api/health%0a127.0.0.1:1 - "GET /admin HTTP/1.1" 200 0.1ms'
    with toolkit.client() as client:
        client.get(forged, headers={"x-request-id": "id\tcarrying\ta tab"})
        client.get("/esc/api/health", headers={"x-request-id": "plain-id"})

    def logged() -> list[str] | None:
        lines = [r.getMessage() for r in caplog.records if r.name == "app_toolkit.access"]
        return lines if len([line for line in lines if "/esc/" in line]) >= 2 else None

    lines = [line for line in wait_for(logged, 10, "two access lines") if "/esc/" in line]
    assert all("\n" not in line for line in lines)
    assert any("/esc/api/health\\x0a127.0.0.1:1 - \\x22GET /admin" in line for line in lines)
    assert any(line.endswith(" plain-id") for line in lines)  # the request id ends the line
    assert not any("carrying" in line for line in lines)  # an unprintable id is replaced
