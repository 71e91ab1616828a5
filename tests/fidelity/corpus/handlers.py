"""Custom request and route classes, exception handlers, error answers."""

from __future__ import annotations

import gzip
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from tests.fidelity.compare import Http


class GzipRequest(Request):
    """A request whose gzip-encoded body the route reads decoded (FastAPI's docs example)."""

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            body = await super().body()
            if "gzip" in self.headers.getlist("Content-Encoding"):
                body = gzip.decompress(body)
            self._body = body
        return self._body


class GzipRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        original = super().get_route_handler()

        async def handler(request: Request) -> Response:
            return await original(GzipRequest(request.scope, request.receive))

        return handler


class TaggingRoute(APIRoute):
    """A route class that adds a header and turns validation errors into a body of its own."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        original = super().get_route_handler()

        async def handler(request: Request) -> Response:
            try:
                response = await original(request)
            except RequestValidationError as exc:
                body = await request.body()
                return JSONResponse({"errors": len(exc.errors()), "body": body.decode()}, status_code=400)
            response.headers["x-route-class"] = type(self).__name__
            return response

        return handler


class Unpaid(Exception):
    def __init__(self, amount: int) -> None:
        self.amount = amount


app = FastAPI(title="handlers")
gzip_router = APIRouter(route_class=GzipRoute)
tagged_router = APIRouter(route_class=TaggingRoute)


@gzip_router.post("/sum")
async def total(numbers: list[int]) -> dict[str, int]:
    return {"sum": sum(numbers)}


@tagged_router.post("/tagged")
async def tagged(numbers: list[int]) -> dict[str, int]:
    return {"count": len(numbers)}


app.include_router(gzip_router)
app.include_router(tagged_router, prefix="/t")


@app.exception_handler(Unpaid)
async def unpaid(request: Request, exc: Unpaid) -> JSONResponse:
    return JSONResponse({"owed": exc.amount}, status_code=402, headers={"x-owed": str(exc.amount)})


@app.exception_handler(StarletteHTTPException)
async def http_error(request: Request, exc: StarletteHTTPException) -> PlainTextResponse:
    return PlainTextResponse(f"handled: {exc.detail}", status_code=exc.status_code, headers=exc.headers)


@app.get("/unpaid")
async def raise_unpaid() -> None:
    raise Unpaid(12)


@app.get("/http-error")
async def raise_http() -> None:
    raise HTTPException(401, "who are you", headers={"www-authenticate": "Bearer"})


@app.get("/crash")
async def crash() -> None:
    raise RuntimeError("internal detail")


@app.get("/crash-sync")
def crash_sync() -> None:
    raise KeyError("internal detail")


@app.get("/validate/{number}")
async def validate(number: int, flag: bool = False) -> dict[str, Any]:
    return {"number": number, "flag": flag}


JSON = ("content-type", "application/json")
EXCHANGES = [
    Http("gzip request class, plain body", method="POST", path="/sum", headers=[JSON], body=b"[1, 2, 3]"),
    Http(
        "gzip request class, gzip body",
        method="POST",
        path="/sum",
        headers=[JSON, ("content-encoding", "gzip")],
        body=gzip.compress(b"[4, 5, 6]", mtime=0),
    ),
    Http("route class adds a header", method="POST", path="/t/tagged", headers=[JSON], body=b"[1]"),
    Http("route class answers invalid input", method="POST", path="/t/tagged", headers=[JSON], body=b'["x"]'),
    Http("custom exception handler", path="/unpaid"),
    Http("HTTPException handler override", path="/http-error"),
    Http("404 through the overridden handler", path="/missing"),
    Http("405 through the overridden handler", method="DELETE", path="/unpaid"),
    Http("unhandled exception", path="/crash"),
    Http("unhandled exception in a sync route", path="/crash-sync"),
    Http("path and query validation errors", path="/validate/x?flag=maybe"),
]
