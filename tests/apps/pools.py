"""Per-route replica pools and deadlines, for the pool tests and the docs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, FastAPI, Header, HTTPException, Request, WebSocket
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.responses import Response

import app_toolkit as tk


def where() -> str:
    return tk.get_replica_context().deployment


# --8<-- [start:pools]
router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"served_by": where()}  # stays in the ingress


@router.get("/items/special")
async def special_item() -> dict[str, str]:
    return {"served_by": where()}  # declared first, so FastAPI picks it over /items/{item_id}


@router.get("/items/{item_id}")
@tk.replicated(num_replicas=2, max_ongoing_requests=16)
async def get_item(item_id: int, x_tenant: str = Header("none")) -> dict[str, Any]:
    return {"item_id": item_id, "tenant": x_tenant, "served_by": where()}


@router.post("/items/{item_id}")
async def update_item(item_id: int) -> dict[str, Any]:
    return {"updated": item_id, "served_by": where()}  # same path, other method: ingress


tokens = APIRouter(prefix="/tokens")


@tokens.get("/stream")
@tk.replicated(name="streamer", max_ongoing_requests=64)
async def stream_tokens(count: int = 5) -> tk.EventStream:
    async def produce() -> AsyncIterator[dict[str, str]]:
        for i in range(count):
            yield {"data": f"token {i} from {where()}"}
            await asyncio.sleep(0)

    return tk.EventStream(produce())


@tokens.websocket("/ws")
@tk.replicated(name="streamer", max_ongoing_requests=64)
async def token_socket(websocket: WebSocket) -> None:
    await websocket.accept()
    async for text in websocket.iter_text():
        await websocket.send_text(f"{text} via {where()}")


# --8<-- [end:pools]


# --8<-- [start:deadline]
@router.get("/slow")
@tk.deadline(0.5)
async def slow(seconds: float = 5.0) -> dict[str, str]:
    await asyncio.sleep(seconds)
    return {"done": "yes"}


# --8<-- [end:deadline]


@router.get("/boom")
@tk.replicated(name="boomer")
async def boom(status: int = 0) -> dict[str, str]:
    if status:
        raise HTTPException(status, "asked for it")
    raise RuntimeError("pool route failed")


class Stamp(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        response.headers["x-stamped-by"] = where()
        return response


def make_app() -> tk.App:
    api = FastAPI(title="pools")
    api.include_router(router, prefix="/api")
    api.include_router(tokens, prefix="/api")
    api.add_middleware(Stamp)
    return tk.App(api, name="pools")
