"""Response kinds: streaming (and server-sent events, JSON lines), files and ranges,
HEAD, OPTIONS, redirects, 304, 204, bodies uploaded and echoed, background tasks and
lifespan state."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import fastapi
from fastapi import BackgroundTasks, FastAPI, Request, Response
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    StreamingResponse,
)
from pydantic import BaseModel
from sse_starlette import EventSourceResponse as StarletteEventSource

from tests.fidelity.compare import Http

#: FastAPI's own streaming of what a path operation yields: JSON lines from 0.134, server-
#: sent events from 0.135 (docs/compatibility.md); before, those routes are not in the app.
FASTAPI_RELEASE = tuple(int(part) for part in fastapi.__version__.split(".")[:2])
FASTAPI_JSON_LINES = FASTAPI_RELEASE >= (0, 134)
FASTAPI_SSE = FASTAPI_RELEASE >= (0, 135)
if FASTAPI_SSE:
    from fastapi.sse import EventSourceResponse, ServerSentEvent

STATIC = Path(__file__).parent / "static"
ETAG = '"v1"'


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    yield {"started": "lifespan ran", "tasks": [], "task_ran": asyncio.Event()}


app = FastAPI(title="responses", lifespan=lifespan)


@app.api_route("/stream", methods=["GET", "HEAD"])
async def stream() -> StreamingResponse:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(5):
            yield f"chunk {i}\n".encode()
            await asyncio.sleep(0)  # a chunk at a time

    return StreamingResponse(chunks(), media_type="text/plain", headers={"x-stream": "1"})


@app.get("/stream-sync")
def stream_sync() -> StreamingResponse:
    def chunks() -> Iterator[str]:
        yield from ("a", "", "b", "c" * 70000)

    return StreamingResponse(chunks(), media_type="text/csv")


@app.get("/stream-fails")
async def stream_fails() -> StreamingResponse:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"first part\n"
        raise RuntimeError("the stream broke")

    return StreamingResponse(chunks(), media_type="text/plain")


@app.get("/status/{code}")
async def status(code: int) -> Response:
    return Response(f"status {code}", status_code=code, headers={"x-latin": "caf\xe9"})


class Token(BaseModel):
    index: int
    text: str


if FASTAPI_SSE:

    @app.get("/events", response_class=EventSourceResponse)
    async def events() -> AsyncIterator[ServerSentEvent]:
        """FastAPI's own server-sent events: a path operation that yields."""
        for i in range(3):
            yield ServerSentEvent(data=f"token {i}", event="token", id=str(i))
        yield ServerSentEvent(data="[DONE]", retry=1000)


if FASTAPI_JSON_LINES:

    @app.get("/json-lines")
    async def json_lines() -> AsyncIterator[Token]:
        """A path operation that yields models: FastAPI streams them as JSON lines."""
        for i in range(3):
            yield Token(index=i, text=f"t{i}")


@app.get("/sse-starlette")
async def sse_starlette() -> StarletteEventSource:
    async def tokens() -> AsyncIterator[dict[str, str]]:
        for i in range(3):
            yield {"event": "token", "data": f"token {i}", "id": str(i)}

    # No keep-alive ping within the stream: their timing would differ between two runs
    # (ping=0 is not "none": sse-starlette then pings at every turn of the loop).
    return StarletteEventSource(tokens(), ping=3600, sep="\n")


@app.get("/stream-empty")
async def stream_empty() -> StreamingResponse:
    async def nothing() -> AsyncIterator[bytes]:
        return
        yield b""

    return StreamingResponse(nothing())


@app.api_route("/file", methods=["GET", "HEAD"])
async def file() -> FileResponse:
    return FileResponse(STATIC / "data.bin", media_type="application/octet-stream")


@app.get("/file-download")
async def file_download() -> FileResponse:
    return FileResponse(STATIC / "site.css", filename="süß style.css")


@app.get("/big")
async def big() -> Response:
    return Response(bytes(range(256)) * 4096, media_type="application/octet-stream")


@app.api_route("/page", methods=["GET", "HEAD", "POST"])
async def page() -> HTMLResponse:
    return HTMLResponse("<p>page</p>", headers={"etag": ETAG})


@app.get("/conditional")
async def conditional(request: Request) -> Response:
    if request.headers.get("if-none-match") == ETAG:
        return Response(status_code=304, headers={"etag": ETAG, "cache-control": "max-age=60"})
    return PlainTextResponse("fresh", headers={"etag": ETAG, "cache-control": "max-age=60"})


@app.get("/no-content", status_code=204)
async def no_content() -> None:
    return None


@app.get("/redirect/{code}")
async def redirect(code: int) -> RedirectResponse:
    return RedirectResponse("/page?from=redirect", status_code=code)


@app.get("/redirect-absolute")
async def redirect_absolute() -> RedirectResponse:
    return RedirectResponse("https://elsewhere.test/a path?q=ü")


@app.post("/upload")
async def upload(request: Request) -> dict[str, Any]:
    body = await request.body()
    return {
        "length": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
        "content_type": request.headers.get("content-type"),
        "content_length": request.headers.get("content-length"),
        "transfer_encoding": request.headers.get("transfer-encoding"),
    }


@app.post("/upload-stream")
async def upload_stream(request: Request) -> dict[str, Any]:
    digest, length = hashlib.sha256(), 0
    async for piece in request.stream():
        digest.update(piece)
        length += len(piece)
    return {"length": length, "sha256": digest.hexdigest()}


@app.post("/background")
async def background(request: Request, tasks: BackgroundTasks) -> dict[str, str]:
    def record(text: str) -> None:
        request.state.tasks.append(text)
        request.state.task_ran.set()

    tasks.add_task(record, "task ran after the response")
    return {"state": request.state.started}


@app.get("/background-result")
async def background_result(request: Request) -> list[str]:
    async with asyncio.timeout(5):
        await request.state.task_ran.wait()
    return list(request.state.tasks)


BODY = bytes(range(256)) * 400
EXCHANGES = [
    Http("async streaming", path="/stream"),
    Http("sync streaming with an empty chunk", path="/stream-sync"),
    Http("empty stream", path="/stream-empty"),
    *(
        [Http("server-sent events (FastAPI)", path="/events", headers=[("accept", "text/event-stream")])]
        if FASTAPI_SSE
        else []
    ),
    *([Http("JSON lines", path="/json-lines")] if FASTAPI_JSON_LINES else []),
    Http("server-sent events (sse-starlette)", path="/sse-starlette"),
    Http("stream that raises after its first chunk", path="/stream-fails"),
    Http("uncommon status, latin-1 header", path="/status/299"),
    Http("unregistered status", path="/status/599"),
    Http("HEAD of a stream", method="HEAD", path="/stream"),
    Http("file", path="/file"),
    Http("file, one range", path="/file", headers=[("range", "bytes=10-19")]),
    Http("file, suffix range", path="/file", headers=[("range", "bytes=-5")]),
    Http("file, range past the end", path="/file", headers=[("range", "bytes=90000-")]),
    Http("file, if-range mismatch", path="/file", headers=[("range", "bytes=0-1"), ("if-range", '"other"')]),
    Http("HEAD of a file", method="HEAD", path="/file"),
    Http("file as a download, non-ASCII name", path="/file-download"),
    Http("a 1 MiB body", path="/big"),
    Http("HEAD of a route", method="HEAD", path="/page"),
    Http("HEAD of a GET-only route", method="HEAD", path="/conditional"),
    Http("OPTIONS of a route", method="OPTIONS", path="/page"),
    Http("method not allowed", method="PUT", path="/page"),
    Http("conditional, fresh", path="/conditional"),
    Http("conditional, 304", path="/conditional", headers=[("if-none-match", ETAG)]),
    Http("204 no content", path="/no-content"),
    Http("redirect 301", path="/redirect/301"),
    Http("redirect 302", path="/redirect/302"),
    Http("redirect 303", path="/redirect/303"),
    Http("redirect 307", path="/redirect/307"),
    Http("redirect 308", path="/redirect/308"),
    Http("absolute redirect with non-ASCII", path="/redirect-absolute"),
    Http(
        "upload with content-length",
        method="POST",
        path="/upload",
        body=BODY,
        headers=[("content-type", "application/x-thing")],
    ),
    Http("upload chunked", method="POST", path="/upload", body=BODY, chunked=True),
    Http("upload streamed into the app", method="POST", path="/upload-stream", body=BODY, chunked=True),
    # Past the toolkit's forwarding window (1 MiB, docs/http.md): the body streams in.
    Http("3 MiB upload", method="POST", path="/upload-stream", body=BODY * 30),
    Http("empty upload", method="POST", path="/upload", body=b""),
    Http("background task and lifespan state", method="POST", path="/background"),
    Http("what the background task did", path="/background-result"),
]
