"""Route code for the streaming benchmark; uvicorn and the toolkit serve this same router."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, FastAPI, WebSocket, WebSocketDisconnect
from sse_starlette import EventSourceResponse

import app_toolkit as tk

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/sse")
async def sse(events: int = 100) -> EventSourceResponse:
    async def produce() -> AsyncIterator[dict[str, str]]:
        for i in range(events):
            yield {"data": f"event {i}"}

    return EventSourceResponse(produce())


@router.get("/pooled/sse")
@tk.replicated(name="sse_pool", max_ongoing_requests=256)
async def pooled_sse(events: int = 100) -> EventSourceResponse:
    """The same stream, served by its own replica pool (a no-op mark under bare uvicorn)."""
    return await sse(events)


@router.websocket("/echo")
async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            await websocket.send_text(await websocket.receive_text())
    except WebSocketDisconnect:
        return


def make_fastapi() -> FastAPI:
    app = FastAPI()
    app.include_router(router)
    return app


fastapi_app = make_fastapi()
app = tk.App(make_fastapi(), name="streambench", max_ongoing_requests=256)
