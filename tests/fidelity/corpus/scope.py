"""What the app sees of a request: scope fields, root_path, URLs it builds, the docs.

Served below a route prefix (which becomes the scope's root_path, as uvicorn's
``--root-path`` makes it) and at the root. (FastAPI's own ``root_path=`` setting is
deprecated: a warning, so an error in this test process.)"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse

from tests.fidelity.compare import Exchange, Http, Raw

app = FastAPI(title="scope")


# Out of the schema: one route of several methods gets one operation id per method, the
# same, and FastAPI warns of the duplicates (an error in this test process's uvicorn).
@app.api_route(
    "/echo/{rest:path}",
    methods=["GET", "POST", "PUT", "DELETE", "PATCH"],
    name="echo",
    include_in_schema=False,
)
async def echo(request: Request, rest: str) -> dict[str, Any]:
    scope = request.scope
    return {
        "type": scope["type"],
        "client_host": scope["client"][0],  # the ports differ between any two servers
        "server_host": scope["server"][0],
        "http_version": scope["http_version"],
        "method": scope["method"],
        "scheme": scope["scheme"],
        "path": scope["path"],
        "raw_path": scope["raw_path"].decode("latin-1"),
        "root_path": scope["root_path"],
        "query_string": scope["query_string"].decode("latin-1"),
        "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in scope["headers"]],
        "rest": rest,
        "url": str(request.url),
        "base_url": str(request.base_url),
        "url_for": str(request.url_for("echo", rest="x/y")),
        "url_path_for": request.app.url_path_for("echo", rest="z"),
        "query_params": list(request.query_params.multi_items()),
        "body": (await request.body()).decode("latin-1"),
    }


@app.get("/asgi")
async def asgi(request: Request) -> dict[str, Any]:
    return {"asgi": request.scope.get("asgi"), "extensions": sorted(request.scope.get("extensions") or {})}


@app.get("/to-echo")
async def to_echo(request: Request) -> RedirectResponse:
    return RedirectResponse(request.url_for("echo", rest="redirected"))


@app.get("/slash/")
async def slash() -> str:
    return "with a slash"


HOST = b"host: fidelity.test\r\n"
EXCHANGES: list[Exchange] = [
    Http("plain GET", path="/echo/a/b"),
    Http("query string", path="/echo/q?a=1&a=2&b=%20x&c"),
    Http("percent-encoded path", path="/echo/caf%C3%A9/a%2Fb"),
    Http("double slashes and dots", path="/echo//a//b/./c/%2E%2E/d"),
    Http("non-UTF-8 query bytes", path="/echo/q?x=%FF%FE&y=%C3%A9"),
    Http(
        "repeated and odd headers",
        path="/echo/h",
        headers=[("x-one", "1"), ("X-Two", "2"), ("x-one", "3"), ("x-empty", ""), ("x-latin", "caf\xe9")],
    ),
    Http("POST body", method="POST", path="/echo/p", body=b"hello", headers=[("content-type", "text/x")]),
    Http("chunked body", method="PUT", path="/echo/c", body=b"0123456789" * 300, chunked=True),
    Http("empty DELETE", method="DELETE", path="/echo/d"),
    Http("ASGI version and extensions", path="/asgi"),
    Http("redirect to url_for", path="/to-echo"),
    Http("redirect_slashes adds a slash", path="/slash"),
    Http("no such route", path="/nowhere"),
    Http("openapi.json servers", path="/openapi.json"),
    Http("docs page", path="/docs"),
    Raw("HTTP/1.0", b"GET {root}/echo/old HTTP/1.0\r\n" + HOST + b"\r\n"),
    Raw(
        "two pipelined requests",
        b"GET {root}/echo/one HTTP/1.1\r\n" + HOST + b"\r\n"
        b"GET {root}/echo/two HTTP/1.1\r\n" + HOST + b"connection: close\r\n\r\n",
    ),
    Raw(
        "expect 100-continue",
        b"POST {root}/echo/expect HTTP/1.1\r\n" + HOST + b"expect: 100-continue\r\n"
        b"content-length: 5\r\nconnection: close\r\n\r\nhello",
    ),
    Raw(
        "absolute-form target",
        b"GET http://fidelity.test{root}/echo/absolute?q=1 HTTP/1.1\r\n"
        + HOST
        + b"connection: close\r\n\r\n",
    ),
    Raw(
        "padded header value, mixed-case name",
        b"GET {root}/echo/pad HTTP/1.1\r\n" + HOST + b"X-Padded:   a b  \r\nconnection: close\r\n\r\n",
    ),
]
