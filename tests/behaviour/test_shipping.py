"""Apps go to replicas as the user wrote them: an app that is an attribute of an importable
module is imported by the replica, and a copy keeps what FastAPI resolved (the apps:
tests/apps/shipping.py), on both backends."""

from __future__ import annotations

from fastapi import FastAPI

import app_toolkit as tk
from app_toolkit.app_builder import as_application
from app_toolkit.import_path import import_attr
from tests.apps import shipping as apps
from tests.conftest import Toolkit
from tests.deployments import as_deployment


def test_an_app_mounting_a_wsgi_app_that_pickle_cannot_write_is_served(toolkit: Toolkit) -> None:
    toolkit.run(tk.App(apps.wsgi_app), route_prefix="/ship-app")
    toolkit.run(tk.App(apps.wsgi_router), route_prefix="/ship-router")
    # As `app-toolkit run tests.apps.shipping:wsgi_app` makes it.
    path = "tests.apps.shipping:wsgi_app"
    toolkit.run(as_application(import_attr(path), path, None), route_prefix="/ship-cli")
    with toolkit.client() as client:
        for prefix in ("/ship-app", "/ship-router", "/ship-cli"):
            assert client.get(f"{prefix}/wsgi/hello").text == "wsgi /hello"
            assert client.get(f"{prefix}/asgi").json() == "asgi"


def test_an_ingress_class_keeps_the_signatures_of_an_included_routers_endpoints(toolkit: Toolkit) -> None:
    # Defined here, the class is copied to the replica with the app @ingress made for it.
    @tk.deployment
    @tk.ingress(apps.make_graph_app())
    class Graph:
        pass

    toolkit.run(as_deployment(Graph).bind(), route_prefix="/ship-graph")
    with toolkit.client() as client:
        answer = client.post("/ship-graph/graphql")
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"path": "/ship-graph/graphql", "tasks": 0}
        assert answer.headers["x-handled"] == "yes"
        schema = client.get("/ship-graph/openapi.json")
        assert schema.status_code == 200, schema.text
        assert schema.json()["paths"]["/graphql"]["post"].get("parameters", []) == []


def test_the_users_app_object_is_left_as_it_was(toolkit: Toolkit) -> None:
    app = FastAPI()

    @app.get("/hello")
    async def hello() -> str:
        return "hello"

    routes, handlers = list(app.router.routes), dict(app.exception_handlers)
    toolkit.run(tk.App(app), route_prefix="/ship-same")
    with toolkit.client() as client:
        assert client.get("/ship-same/hello").json() == "hello"
        docs = client.get("/ship-same/docs")  # the replica's offline page, on its copy
        assert docs.status_code == 200 and "/ship-same/docs/assets/swagger-ui-bundle.js" in docs.text
    if toolkit.backend == "local":  # the replica runs in this process: what it adds stays in its copy
        assert app.router.routes == routes and app.exception_handlers == handlers
        assert app.middleware_stack is None
