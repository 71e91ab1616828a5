"""``@ingress(app)`` serves a copy of a FastAPI app: the user's app object never changes,
so one app may serve several classes, each with the routes of its own methods."""

from __future__ import annotations

import inspect

import pytest
from fastapi import FastAPI, Request
from fastapi.routing import APIRoute

import app_toolkit as tk
from app_toolkit._runtime.replica.ingress_app import ASGI_APP_ATTR
from app_toolkit.testing import TestClient
from tests.deployments import as_deployment

shared = FastAPI()


@shared.get("/plain")
def plain() -> dict[str, str]:
    return {"from": "plain function"}


@tk.deployment
@tk.ingress(shared)
class First:
    def __init__(self) -> None:
        self.name = "first"

    @shared.get("/first")
    def first(self) -> dict[str, str]:
        return {"from": self.name}


@tk.deployment
@tk.ingress(shared)
class Second:
    def __init__(self) -> None:
        self.name = "second"

    @shared.get("/second")
    def second(self, times: int = 1) -> dict[str, str]:
        return {"from": self.name * times}


def _paths(app: FastAPI) -> set[str]:
    return {route.path for route in app.router.routes if isinstance(route, APIRoute)}


def test_the_users_app_is_left_as_it_was() -> None:
    assert _paths(shared) == {"/plain", "/first", "/second"}
    endpoints = {route.path: route.endpoint for route in shared.router.routes if isinstance(route, APIRoute)}
    assert endpoints["/first"] is as_deployment(First).func_or_class.__dict__["first"]  # not rebound in place
    for cls, own in ((First, "/first"), (Second, "/second")):
        copy = getattr(as_deployment(cls).func_or_class, ASGI_APP_ATTR)
        assert copy is not shared and _paths(copy) == {"/plain", own}


def test_each_class_serves_its_own_methods_and_the_plain_routes(no_backend: None) -> None:
    with TestClient(as_deployment(Second).bind()) as client:
        assert client.get("/second", params={"times": 2}).json() == {"from": "secondsecond"}
        assert client.get("/plain").json() == {"from": "plain function"}
        assert client.get("/first").status_code == 404  # another class's route
        schema = client.get("/openapi.json").json()
        assert set(schema["paths"]) == {"/plain", "/second"}
        # self is injected, not a query parameter of the documented route.
        names = [p["name"] for p in schema["paths"]["/second"]["get"].get("parameters", [])]
        assert names == ["times"]
    with TestClient(as_deployment(First).bind()) as client:
        assert client.get("/first").json() == {"from": "first"}
        assert client.get("/second").status_code == 404


@pytest.mark.skipif(
    "max_body_size" not in inspect.signature(FastAPI).parameters,
    reason="FastAPI(max_body_size=) exists from FastAPI 0.164 on (docs/compatibility.md)",
)
def test_the_middleware_of_the_apps_router_wraps_the_copy(no_backend: None) -> None:
    limited = FastAPI(max_body_size=16)  # the router's own middleware, as FastAPI adds it

    @tk.deployment
    @tk.ingress(limited)
    class Limited:
        @limited.post("/")
        async def root(self, request: Request) -> int:
            return len(await request.body())

    with TestClient(as_deployment(Limited).bind()) as client:
        assert client.post("/", content=b"x" * 16).json() == 16  # the copy's route, with self
        assert client.post("/", content=b"x" * 17).status_code == 413  # the router's limit
    layers: list[object] = [limited.router.middleware_stack]  # the user's app is unchanged:
    while layers[-1] != limited.router.app and len(layers) < 10:  # its stack ends at its router
        layers.append(getattr(layers[-1], "app", None))
    assert layers[-1] == limited.router.app
