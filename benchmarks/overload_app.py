"""What the overload benchmark serves (the toolkit's default options, a route that costs
real CPU, a stream and a WebSocket) and the handle-called deployment of the soak."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, FastAPI, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse

import app_toolkit as tk

router = APIRouter()


@router.get("/work")
async def work(ms: float = 2.0) -> dict[str, int]:
    """Burns ``ms`` of CPU on the replica's loop (what a small model or a template does)."""
    end = time.perf_counter() + ms / 1000
    count = 0
    while time.perf_counter() < end:
        count += 1
    return {"spins": count}


@router.get("/pid")
async def pid() -> int:
    return os.getpid()


@router.get("/stream")
async def stream(events: int = 20) -> StreamingResponse:
    async def produce() -> AsyncIterator[bytes]:
        for number in range(events):
            await asyncio.sleep(0.01)
            yield f"data: {number}\n\n".encode()

    return StreamingResponse(produce(), media_type="text/event-stream")


@router.websocket("/echo")
async def echo(socket: WebSocket) -> None:
    await socket.accept()
    try:
        while True:
            await socket.send_text(await socket.receive_text())
    except WebSocketDisconnect:
        pass


def make_fastapi() -> FastAPI:
    api = FastAPI()
    api.include_router(router)
    return api


#: ``app-toolkit run benchmarks.overload_app:app``: every option at its default.
app = tk.App(make_fastapi(), name="overload")


@tk.deployment(num_replicas=2, health_check_period_s=1, health_check_timeout_s=2)
class Adder:
    """Called through a handle by the soak's driver."""

    async def add(self, a: int, b: int) -> int:
        await asyncio.sleep(0.005)
        return a + b


#: The soak's handle-only deployment (its HTTP apps: benchmarks/soak_apps.py).
soak_handles = Adder.bind()
