"""Middleware: CORS, GZip, TrustedHost, BaseHTTPMiddleware, a pure ASGI middleware."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI, Request, Response
from fastapi.middleware.cors import CORSMiddleware
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.middleware.trustedhost import TrustedHostMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.fidelity.compare import HOST, Http


class Stamp(BaseHTTPMiddleware):
    """Adds headers, and answers /blocked itself."""

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.url.path.endswith("/blocked"):
            return PlainTextResponse("blocked by middleware", status_code=403)
        response = await call_next(request)
        response.headers["x-stamp"] = request.method
        response.headers.append("x-multi", "1")
        response.headers.append("x-multi", "2")
        return response


class PureHeader:
    """A pure ASGI middleware that adds a header to each HTTP answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], (b"x-pure", b"yes")]}
            await send(message)

        await self.app(scope, receive, sending)


app = FastAPI(title="middleware")
app.add_middleware(Stamp)
app.add_middleware(PureHeader)
app.add_middleware(GZipMiddleware, minimum_size=500)
app.add_middleware(
    CORSMiddleware,
    allow_origins=["https://front.test"],
    allow_methods=["GET", "POST"],
    allow_headers=["x-token"],
    allow_credentials=True,
    expose_headers=["x-stamp"],
    max_age=600,
)
app.add_middleware(TrustedHostMiddleware, allowed_hosts=[HOST, "*.fidelity.test"])


@app.get("/small")
async def small() -> dict[str, str]:
    return {"size": "small"}


@app.get("/large")
async def large() -> PlainTextResponse:
    return PlainTextResponse("compress me " * 500)


@app.get("/large-stream")
async def large_stream() -> StreamingResponse:
    async def lines() -> AsyncIterator[str]:
        for i in range(200):
            yield f"line {i} of a compressible stream\n"

    return StreamingResponse(lines(), media_type="text/plain")


@app.post("/json")
async def json_body(payload: dict[str, int]) -> JSONResponse:
    return JSONResponse(payload, headers={"x-keys": ",".join(payload)})


@app.get("/blocked")
async def blocked() -> str:
    return "never"


ORIGIN = ("origin", "https://front.test")
GZIP = ("accept-encoding", "gzip")
EXCHANGES = [
    Http("small, gzip accepted", path="/small", headers=[GZIP]),
    Http("large, gzip accepted", path="/large", headers=[GZIP]),
    Http("large, identity", path="/large", headers=[("accept-encoding", "identity")]),
    Http("large stream, gzip", path="/large-stream", headers=[GZIP]),
    Http("CORS simple request", path="/small", headers=[ORIGIN]),
    Http("CORS other origin", path="/small", headers=[("origin", "https://evil.test")]),
    Http(
        "CORS preflight",
        method="OPTIONS",
        path="/json",
        headers=[
            ORIGIN,
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "x-token"),
        ],
    ),
    Http(
        "CORS preflight refused",
        method="OPTIONS",
        path="/json",
        headers=[ORIGIN, ("access-control-request-method", "DELETE")],
    ),
    Http(
        "POST through every middleware",
        method="POST",
        path="/json",
        body=b'{"a": 1, "b": 2}',
        headers=[ORIGIN, GZIP, ("content-type", "application/json")],
    ),
    Http("untrusted host", path="/small", headers=[("host", "evil.test")]),
    Http("trusted subdomain", path="/small", headers=[("host", "api.fidelity.test")]),
    Http("answered by BaseHTTPMiddleware", path="/blocked"),
    Http("404 through the middleware", path="/missing", headers=[GZIP]),
]
