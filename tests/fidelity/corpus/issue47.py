"""The apps of issue #47's items 1-3, which the toolkit served differently: duplicate
routes (refused at deploy), a module-level app mounting a WSGI app that holds an
unpicklable object (failed to deploy on Ray), a GraphQL-style router under @ingress (its
lazily included routes lost their annotations on Ray)."""

# As in strawberry's router module: the routes' annotations are strings, which FastAPI
# resolves in the endpoint's module globals.
from __future__ import annotations

import json
import sqlite3
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse

import app_toolkit as tk
from app_toolkit.deployment import Deployment
from tests.deployments import as_deployment
from tests.fidelity.compare import Exchange, Http, Ws

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # see mounts.py
    warnings.simplefilter("ignore", DeprecationWarning)
    from starlette.middleware.wsgi import WSGIMiddleware

# ----------------------------------------------------------------- 1: duplicate routes

duplicates = FastAPI(title="duplicates")


@duplicates.get("/item")
async def first_item() -> str:
    return "first"


@duplicates.get("/item")
async def second_item() -> str:  # never reached: Starlette's first match wins
    return "second"


@duplicates.api_route("/item", methods=["GET", "POST"])
async def any_item(request: Request) -> str:
    return f"any {request.method}"


DUPLICATES = [
    Http("first of duplicate routes wins", path="/item"),
    Http("a later route answers another method", method="POST", path="/item"),
]

# ----------------------------------------------------------------- 2: WSGI app with a connection


class PagesWsgi:
    """A WSGI app holding a database connection, as Flask and Django apps do (a
    ``sqlite3.Connection`` cannot be pickled)."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.db.execute("create table pages (path text, title text)")
        self.db.execute("insert into pages values ('/page', 'A page')")

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., object]) -> Iterable[bytes]:
        row = self.db.execute("select title from pages where path = ?", (environ["PATH_INFO"],)).fetchone()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [f"wsgi {environ['PATH_INFO']}: {row[0] if row else 'no page'}".encode()]


wsgi_with_connection = FastAPI(title="wsgi-with-connection")
wsgi_with_connection.mount("/legacy", WSGIMiddleware(PagesWsgi()))


@wsgi_with_connection.get("/native")
async def native() -> str:
    return "native"


WSGI_WITH_CONNECTION = [
    Http("route beside the WSGI mount", path="/native"),
    Http("the WSGI app", path="/legacy/page"),
]

# ----------------------------------------------------------------- 3: GraphQL-style router


class GraphQLRouter(APIRouter):
    """Shaped like strawberry's GraphQLRouter: an APIRouter whose routes are closures over
    the router, declared in its constructor, with the router's own context getter as a
    dependency, in a module of string annotations."""

    def __init__(self, answers: dict[str, Any], path: str = "") -> None:
        super().__init__()
        self.answers = answers

        @self.get(path)
        async def handle_get(query: str, context: dict[str, str] = Depends(self.context_getter)) -> Any:
            return JSONResponse(self.execute(query, context))

        @self.post(path)
        async def handle_post(
            request: Request, context: dict[str, str] = Depends(self.context_getter)
        ) -> Any:
            payload = await request.json()
            return JSONResponse(self.execute(payload["query"], context))

        @self.websocket(path)
        async def handle_ws(websocket: WebSocket) -> None:
            await websocket.accept(subprotocol="graphql-transport-ws")
            message = json.loads(await websocket.receive_text())
            await websocket.send_text(
                json.dumps({"type": "next", "payload": self.execute(message["query"], {})})
            )
            await websocket.close(4400, "complete")

    async def context_getter(self, request: Request) -> dict[str, str]:
        return {"user": request.headers.get("x-user", "anonymous")}

    def execute(self, query: str, context: dict[str, str]) -> dict[str, Any]:
        return {"data": {query: self.answers.get(query)}, "extensions": context}


def make_graphql_app() -> FastAPI:
    """A fresh app each time: FastAPI builds an included router's routes on its first
    request, and a deploy must send the app as it is before serving anything."""
    app = FastAPI(title="graphql")
    app.include_router(GraphQLRouter({"hello": "world", "n": 3}), prefix="/graphql")

    @app.get("/health")
    async def health() -> str:
        return "ok"

    return app


def graphql_ingress(app: FastAPI) -> Deployment:
    """``app`` served from a deployment class, as Ray Serve users write it."""

    @tk.deployment
    @tk.ingress(app)
    class GraphQLIngress:
        pass

    return as_deployment(GraphQLIngress)


GRAPHQL: list[Exchange] = [
    Http("plain route beside the GraphQL router", path="/health"),
    Http("GraphQL GET", path="/graphql?query=hello", headers=[("x-user", "ann")]),
    Http(
        "GraphQL POST",
        method="POST",
        path="/graphql",
        body=b'{"query": "n"}',
        headers=[("content-type", "application/json")],
    ),
    Ws(
        "GraphQL WebSocket",
        "/graphql",
        subprotocols=["graphql-transport-ws"],
        steps=[("send", '{"query": "hello"}'), ("recv", None)],
    ),
]
