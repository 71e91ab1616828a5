"""A program written against Ray Serve's API, with only the import changed.

Original first line: ``from ray import serve``.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, WebSocket, WebSocketDisconnect

import app_toolkit as serve
from app_toolkit import DeploymentHandle

app = FastAPI()


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Doubler:
    def double(self, x: int) -> int:
        return 2 * x


# --8<-- [start:ingress]
@serve.deployment
@serve.ingress(app)
class Api:
    def __init__(self, doubler: DeploymentHandle) -> None:
        self.doubler = doubler

    @app.get("/double/{x}")
    async def double(self, x: int) -> int:
        doubled: int = await self.doubler.double.remote(x)
        return doubled


# --8<-- [end:ingress]


@serve.deployment(max_ongoing_requests=1, max_queued_requests=1)
class Slow:
    async def __call__(self, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "done"


@serve.deployment
@serve.batch(max_batch_size=4, batch_wait_timeout_s=0.25)
async def batched_tag(xs: list[int]) -> list[tuple[int, int]]:
    """A batched *function* deployment: each caller gets its item back with its batch size."""
    return [(x, len(xs)) for x in xs]


ws_app = FastAPI()


@serve.deployment
@serve.ingress(ws_app)
class Chatter:
    """WebSocket routes declared on the ingress class's own methods (they get ``self``)."""

    def __init__(self) -> None:
        self.prefix = "chatter"
        self.disconnects = 0

    @ws_app.websocket("/echo/{label}")
    async def echo(self, websocket: WebSocket, label: str) -> None:
        await websocket.accept()
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    self.disconnects += 1
                    return
                text = message.get("text")
                if text == "bye":
                    await websocket.close(code=4002, reason=f"bye from {label}")
                    return
                if text is not None:
                    await websocket.send_text(f"{self.prefix}/{label}:{text}")
                else:
                    await websocket.send_bytes(message["bytes"][::-1])
        except WebSocketDisconnect:
            self.disconnects += 1

    @ws_app.get("/disconnects")
    def count_disconnects(self) -> int:
        return self.disconnects
