"""``@ingress(app)`` serves a copy of a FastAPI app: the user's app object never changes,
so one app may serve several classes, each with the routes of its own methods."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

import app_toolkit as tk
from app_toolkit._runtime.replica.replica import ASGI_APP_ATTR
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


def test_an_app_whose_router_has_middleware_of_its_own_is_refused_with_the_fix() -> None:
    limited = FastAPI(max_body_size=1024)

    class Limited:
        @limited.get("/")
        def root(self) -> str:
            return "ok"

    with pytest.raises(tk.ConfigError, match="max_request_body_bytes"):
        tk.ingress(limited)(Limited)
