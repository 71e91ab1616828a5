"""Mounts: static files (with 304s and ranges), a WSGI app, a FastAPI sub-application,
a Starlette router."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.staticfiles import StaticFiles
from starlette.routing import Route, Router

from tests.fidelity.compare import Http

with warnings.catch_warnings():
    # Deprecated in favour of a2wsgi (not installed here); still what many apps mount.
    # Newer Starlette warns with its StarletteDeprecationWarning (a UserWarning), older
    # with a DeprecationWarning.
    warnings.simplefilter("ignore", UserWarning)
    warnings.simplefilter("ignore", DeprecationWarning)
    from starlette.middleware.wsgi import WSGIMiddleware

STATIC = Path(__file__).parent / "static"


def wsgi_app(environ: dict[str, Any], start_response: Callable[..., object]) -> Iterable[bytes]:
    """A plain WSGI app: echoes what WSGI saw of the request."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length)
    lines = [
        f"{key}={environ.get(key, '')}"
        for key in (
            "REQUEST_METHOD",
            "SCRIPT_NAME",
            "PATH_INFO",
            "QUERY_STRING",
            "HTTP_HOST",
            "HTTP_X_CUSTOM",
        )
    ]
    lines.append(f"body={body.decode()}")
    start_response("200 OK", [("Content-Type", "text/plain"), ("X-Wsgi", "yes"), ("X-Wsgi", "twice")])
    return ["\n".join(lines).encode()]


sub = FastAPI(title="sub-application")


@sub.middleware("http")
async def sub_header(request: Request, call_next: Any) -> Any:
    response = await call_next(request)
    response.headers["x-sub"] = "yes"
    return response


@sub.exception_handler(LookupError)
async def sub_lookup(request: Request, exc: LookupError) -> JSONResponse:
    return JSONResponse({"sub_missing": str(exc)}, status_code=404)


@sub.get("/where")
async def where(request: Request) -> dict[str, str]:
    return {
        "path": request.scope["path"],
        "root_path": request.scope["root_path"],
        "url": str(request.url),
        "url_for": str(request.url_for("where")),
    }


@sub.get("/lookup")
async def lookup() -> None:
    raise LookupError("no such key")


async def plain_route(request: Request) -> PlainTextResponse:
    return PlainTextResponse(f"router route at {request.url.path} under {request.scope['root_path']!r}")


app = FastAPI(title="mounts")
app.mount("/static", StaticFiles(directory=STATIC, html=True), name="static")
app.mount("/wsgi", WSGIMiddleware(wsgi_app))
app.mount("/sub", sub)
app.mount("/router", Router([Route("/plain", plain_route)]))


@app.get("/links")
async def links(request: Request) -> dict[str, str]:
    return {"static": str(request.url_for("static", path="site.css"))}


def static_etag(name: str) -> str:
    """The etag StaticFiles gives a file (Starlette's FileResponse: its mtime and size)."""
    stat = (STATIC / name).stat()
    return f'"{hashlib.md5(f"{stat.st_mtime}-{stat.st_size}".encode(), usedforsecurity=False).hexdigest()}"'


FUTURE = "Fri, 01 Jan 2100 00:00:00 GMT"
EXCHANGES = [
    Http("static file", path="/static/site.css"),
    Http("static html index", path="/static/"),
    Http("static directory without slash", path="/static"),
    Http("static 304 by if-modified-since", path="/static/site.css", headers=[("if-modified-since", FUTURE)]),
    Http(
        "static, stale if-modified-since",
        path="/static/site.css",
        headers=[("if-modified-since", "Thu, 01 Jan 1970 00:00:00 GMT")],
    ),
    Http(
        "static 304 by its etag",
        path="/static/site.css",
        headers=[("if-none-match", static_etag("site.css"))],
    ),
    Http("static, another etag", path="/static/site.css", headers=[("if-none-match", '"nope"')]),
    Http("static range", path="/static/data.bin", headers=[("range", "bytes=100-199")]),
    Http("static HEAD", method="HEAD", path="/static/data.bin"),
    Http("static missing file", path="/static/none.txt"),
    Http("static POST", method="POST", path="/static/site.css"),
    Http("static path traversal", path="/static/..%2F__init__.py"),
    Http("WSGI GET", path="/wsgi/some/path?x=1", headers=[("x-custom", "c")]),
    Http("WSGI POST", method="POST", path="/wsgi/", body=b"posted"),
    Http("sub-application route", path="/sub/where"),
    Http("sub-application exception handler", path="/sub/lookup"),
    Http("sub-application 404", path="/sub/none"),
    Http("sub-application docs", path="/sub/openapi.json"),
    Http("router mount", path="/router/plain"),
    Http("url_for into a mount", path="/links"),
]
