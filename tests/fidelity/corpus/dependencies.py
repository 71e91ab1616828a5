"""Dependencies with ``yield``: cleanup order, errors caught, raised and raised after the answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse

from tests.fidelity.compare import Http


class Log:
    """What this server's dependencies did, in order (one per server: lifespan state)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.changed = asyncio.Event()

    def add(self, line: str) -> None:
        self.lines.append(line)
        self.changed.set()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    yield {"log": Log()}


def log_of(request: Request) -> Log:
    log = request.state.log
    assert isinstance(log, Log)
    return log


class Conflict(Exception):
    pass


async def outer(request: Request) -> AsyncIterator[str]:
    log = log_of(request)
    log.add("outer start")
    try:
        yield "outer"
    except Conflict:
        log.add("outer saw Conflict")
        raise HTTPException(409, "conflict, seen by outer") from None
    finally:
        log.add("outer end")


async def inner(request: Request, up: Annotated[str, Depends(outer)]) -> AsyncIterator[str]:
    log = log_of(request)
    log.add("inner start")
    try:
        yield up + "+inner"
    finally:
        log.add("inner end")


def sync_dependency(request: Request) -> Iterator[str]:
    log_of(request).add("sync start")
    yield "sync"
    log_of(request).add("sync end")


async def fails_on_exit(request: Request) -> AsyncIterator[None]:
    yield
    log_of(request).add("failing exit")
    raise HTTPException(418, "raised after the answer")


async def errors_on_exit(request: Request) -> AsyncIterator[None]:
    yield
    log_of(request).add("erroring exit")
    raise RuntimeError("cleanup failed")


app = FastAPI(lifespan=lifespan)


@app.get("/chain")
async def chain(
    value: Annotated[str, Depends(inner)], other: Annotated[str, Depends(sync_dependency)]
) -> str:
    return f"{value} {other}"


@app.get("/conflict")
async def conflict(value: Annotated[str, Depends(inner)]) -> str:
    raise Conflict()


@app.get("/not-found")
async def not_found(value: Annotated[str, Depends(inner)]) -> str:
    raise HTTPException(404, "nothing here", headers={"x-reason": "none"})


@app.get("/exit-raises-http")
async def exit_raises_http(_: Annotated[None, Depends(fails_on_exit)]) -> str:
    return "answered before the exit code"


@app.get("/exit-raises-error")
async def exit_raises_error(_: Annotated[None, Depends(errors_on_exit)]) -> str:
    return "answered before the exit code"


@app.get("/stream-with-dependency")
async def stream(value: Annotated[str, Depends(inner)]) -> StreamingResponse:
    async def chunks() -> AsyncIterator[str]:
        for i in range(3):
            yield f"{value} {i}\n"

    return StreamingResponse(chunks(), media_type="text/plain")


@app.get("/log")
async def read_log(request: Request, lines: int) -> list[str]:
    """The log once it holds ``lines`` lines (cleanups may run after the answer went out)."""
    log = log_of(request)
    async with asyncio.timeout(5):
        while len(log.lines) < lines:
            log.changed.clear()
            await log.changed.wait()
    return log.lines


EXCHANGES = [
    Http("nested and sync dependencies", path="/chain"),
    Http("log after the chain", path="/log?lines=6"),
    Http("exception seen by the outer dependency", path="/conflict"),
    Http("log after the conflict", path="/log?lines=11"),
    Http("HTTPException through dependencies", path="/not-found"),
    Http("log after the 404", path="/log?lines=15"),
    Http("exit code raises HTTPException", path="/exit-raises-http"),
    Http("log after the exit raised", path="/log?lines=16"),
    Http("exit code raises an error", path="/exit-raises-error"),
    Http("log after the exit error", path="/log?lines=17"),
    Http("streaming with a yield dependency", path="/stream-with-dependency"),
    Http("log after the stream", path="/log?lines=21"),
]
