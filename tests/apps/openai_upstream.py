"""A small OpenAI-compatible server that calls tools, for the chat example's ``openai``
backend to relay to (no real model server with tool calls runs on these machines). It
answers a request offering tools with a call of the first tool, a request carrying a tool's
result with text, ``n`` choices when asked, and keeps the last request body at ``/last``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

import app_toolkit as tk

router = APIRouter()
last: dict[str, Any] = {}


def _choices(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = body.get("tools") or []
    if tools and body["messages"][-1]["role"] != "tool":
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": tools[0]["function"]["name"], "arguments": json.dumps({"city": "Paris"})},
        }
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        return [{"index": 0, "message": message, "finish_reason": "tool_calls"}]
    text = "It is sunny." if tools else "plain"
    return [
        {"index": i, "message": {"role": "assistant", "content": f"{text} ({i})"}, "finish_reason": "stop"}
        for i in range(body.get("n") or 1)
    ]


def _chunks(answer: dict[str, Any]) -> Iterator[str]:
    head = {key: answer[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    for choice in answer["choices"]:
        message = choice["message"]
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": message["content"] and ""}]
        for call in message.get("tool_calls") or []:
            arguments = call["function"]["arguments"]
            start = {
                "index": 0,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            deltas += [
                {"tool_calls": [start]},
                {"tool_calls": [{"index": 0, "function": {"arguments": arguments[:5]}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": arguments[5:]}}]},
            ]
        if message["content"]:
            deltas.append({"content": message["content"]})
        for delta in deltas:
            body = head | {"choices": [{"index": choice["index"], "delta": delta, "finish_reason": None}]}
            yield f"data: {json.dumps(body)}\n\n"
        done = head | {
            "choices": [{"index": choice["index"], "delta": {}, "finish_reason": choice["finish_reason"]}]
        }
        yield f"data: {json.dumps(done)}\n\n"
    yield "data: [DONE]\n\n"


@router.post("/v1/chat/completions", response_model=None)
async def completions(request: Request) -> dict[str, Any] | StreamingResponse:
    body = await request.json()
    last.clear()
    last.update(body)
    answer = {
        "id": "chatcmpl-up",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body["model"],
        "choices": _choices(body),
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    if body.get("stream"):
        return StreamingResponse(_chunks(answer), media_type="text/event-stream")
    return answer


@router.get("/last")
async def last_request() -> dict[str, Any]:
    return last


def make_app() -> tk.App:
    return tk.App(router, name="upstream")
