"""SSE and OpenAI-style streaming routes for the streaming tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

import app_toolkit as tk

router = APIRouter()


# --8<-- [start:events]
@router.get("/events")
async def events(count: int = 3, delay: float = 0.0, ping: float = 15.0) -> tk.EventStream:
    async def produce() -> AsyncIterator[Any]:
        for i in range(count):
            if delay:
                await asyncio.sleep(delay)
            yield {"event": "tick", "data": f"tick {i}"} if i % 2 else f"plain {i}"

    return tk.EventStream(produce(), ping_s=ping)


# --8<-- [end:events]


@router.get("/endless")
async def endless() -> tk.EventStream:
    async def produce() -> AsyncIterator[dict[str, int]]:
        i = 0
        while True:
            yield {"n": i}
            i += 1
            await asyncio.sleep(0.05)

    return tk.EventStream(produce())


# --8<-- [start:feed]
@router.get("/prices")
async def prices() -> tk.EventStream:
    async def quotes() -> AsyncIterator[dict[str, float]]:
        price = 100.0
        while True:
            yield {"price": price}
            price += 0.25
            await asyncio.sleep(0.05)

    # Endless, and a client that reconnects misses nothing it needs: the stream may end as
    # soon as its replica starts draining, instead of holding the drain to its deadline.
    return tk.EventStream(quotes(), end_at_drain=True)


# --8<-- [end:feed]


@router.websocket("/ws")
async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            await websocket.send_text("echo:" + await websocket.receive_text())
    except WebSocketDisconnect:
        pass


class Message(BaseModel):
    role: str
    content: str


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    model: str
    messages: list[Message]
    stream: bool = False
    stream_options: StreamOptions | None = None


# --8<-- [start:chat]
@router.post("/v1/chat/completions")
async def chat(request: ChatRequest) -> tk.ChatCompletionStream:
    prompt = request.messages[-1].content

    async def pieces() -> AsyncIterator[str]:
        for word in prompt.split():
            if word == "explode":
                raise RuntimeError("the model crashed")
            yield word.upper() + " "
            await asyncio.sleep(0)

    usage = request.stream_options.include_usage if request.stream_options else False
    return tk.ChatCompletionStream(
        pieces(), model=request.model, include_usage=usage, prompt_tokens=len(prompt.split())
    )


# --8<-- [end:chat]


@router.get("/firehose")
async def firehose(mib: int = 1024) -> StreamingResponse:
    """``mib`` MiB as fast as the client lets it (what a slow reader must hold back)."""

    async def chunks() -> AsyncIterator[bytes]:
        chunk = b"x" * (1 << 20)
        for _ in range(mib):
            yield chunk

    return StreamingResponse(chunks(), media_type="application/octet-stream")


def make_app(**options: Any) -> tk.App:
    return tk.App(router, **options)
