"""The chat benchmark's bare-uvicorn side: the echo model's generator behind one FastAPI
route, streamed with the same ``ChatCompletionStream``; no pools, no handles."""

from __future__ import annotations

import os

from fastapi import FastAPI

import app_toolkit as tk
from examples.chat.chat.engines.echo import EchoEngine
from examples.chat.chat.schemas import ChatCompletionRequest
from examples.chat.chat.settings import Settings

settings = Settings(backend="echo", echo_tokens_per_s=float(os.environ.get("CHAT_ECHO_TOKENS_PER_S", "50")))
engine = EchoEngine(settings)
fastapi_app = FastAPI()


@fastapi_app.get("/v1/models")
async def models() -> dict[str, str]:
    return {"object": "list"}


@fastapi_app.post("/v1/chat/completions")
async def completions(request: ChatCompletionRequest) -> tk.ChatCompletionStream:
    generation = request.generation(settings)
    return tk.ChatCompletionStream(
        engine.stream(generation), model="echo", prompt_tokens=engine.count_prompt(generation)
    )
