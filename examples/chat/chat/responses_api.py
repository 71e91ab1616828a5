"""OpenAI's Responses API (``POST /v1/responses``): text in, text out, plain or streamed
with the Responses event types, for clients that default to it (the AI SDK's ``openai``
provider, ``client.responses.create``/``.stream``). This server keeps no responses:
``previous_response_id`` and ``store`` do not make it remember a conversation."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

import app_toolkit as tk
from app_toolkit.llm.errors import ANSWERED, OpenAIError, stream_error
from pydantic import BaseModel, ConfigDict, Field

from .schemas import (
    MAX_TEXT,
    ContentPart,
    Delta,
    Generation,
    OptionRules,
    checked_options,
    joined_text,
    role_of,
    unsupported,
)
from .settings import Settings

logger = logging.getLogger(__name__)

#: Part types that carry text in an input message: the user's and earlier replies'.
TEXT_PARTS = frozenset({"input_text", "output_text"})
#: Responses options: the default is accepted, anything else refused by name.
RULES = OptionRules(
    refused={
        "tools": (None, []),
        "tool_choice": (None, "none", "auto"),
        "text": (None, {"format": {"type": "text"}}),
        "reasoning": (None, {}),
        "top_logprobs": (None, 0),
        "background": (None, False),
        "conversation": (None,),
        "prompt": (None,),
        "max_tool_calls": (None,),
    },
    forwarded={},
    ignored=frozenset(
        {
            "user",
            "store",
            "metadata",
            "service_tier",
            "parallel_tool_calls",
            "safety_identifier",
            "prompt_cache_key",
            "include",
            "truncation",
            "stream_options",
        }
    ),
)


class InputItem(BaseModel):
    """An item of ``input``: a message (``type`` may be left out); other item types are
    refused by name when the request is read."""

    model_config = ConfigDict(extra="allow")

    type: str = Field("message", max_length=64)
    role: str | None = Field(None, max_length=64)
    content: str | list[ContentPart] | None = Field(None, max_length=MAX_TEXT)


class ResponsesRequest(BaseModel):
    """The part of a Responses API request this server answers; other options are refused
    by name unless they change nothing (:data:`RULES`)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: (
        Annotated[str, Field(max_length=MAX_TEXT)]
        | Annotated[list[InputItem], Field(min_length=1, max_length=500)]
    )
    instructions: str | None = Field(None, max_length=MAX_TEXT)
    stream: bool = False
    max_output_tokens: int | None = Field(None, ge=1, le=32_768)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    previous_response_id: str | None = None

    def generation(self, settings: Settings) -> Generation:
        if self.previous_response_id:
            raise unsupported(
                "previous_response_id",
                "This server keeps no responses; send the whole conversation in input.",
            )
        checked_options(dict(self.model_extra or {}), settings.backend, RULES)
        turns = [("system", self.instructions)] if self.instructions else []
        if isinstance(self.input, str):
            turns.append(("user", self.input))
        else:
            turns.extend(_turn(item, index) for index, item in enumerate(self.input))
        if not any(role == "user" for role, _ in turns):
            raise OpenAIError(
                400, "input holds no user message.", "invalid_request_error", "invalid_value", "input"
            )
        return Generation(
            messages=tuple(turns),
            max_tokens=settings.reply_tokens(self.max_output_tokens),
            temperature=settings.default_temperature if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
        )


def _turn(item: InputItem, index: int) -> tuple[str, str]:
    if item.type != "message":
        raise unsupported(
            f"input[{index}].type",
            f"Input items of type {item.type!r} are not supported: this server takes messages only "
            "(with the AI SDK, set providerOptions.openai.store to false: earlier replies go as text).",
        )
    role = role_of(item.role or "", f"input[{index}].role")
    return role, joined_text(item.content, f"input[{index}].content", TEXT_PARTS)


class Reply:
    """One response object as it grows: the same fields in every event that carries it."""

    def __init__(self, request: ResponsesRequest, model: str, prompt_tokens: int) -> None:
        self.id = f"resp_{uuid.uuid4().hex}"
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.request = request
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.text: list[str] = []
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.events = 0  # the sequence_number of the last event streamed

    def next_number(self) -> int:
        """The sequence_number of the streamed response's next event."""
        self.events += 1
        return self.events

    def event(self, kind: str, **fields: Any) -> dict[str, str]:
        """The next event of the streamed response."""
        data = {"type": kind, "sequence_number": self.next_number(), **fields}
        return {"event": kind, "data": json.dumps(data)}

    def part(self) -> dict[str, Any]:
        return {"type": "output_text", "text": "".join(self.text), "annotations": [], "logprobs": []}

    def message(self, status: str) -> dict[str, Any]:
        content = [self.part()] if status == "completed" else []
        return {
            "id": self.message_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def response(self, status: str) -> dict[str, Any]:
        done = status != "in_progress"
        incomplete = {"reason": "max_output_tokens"} if self.finish_reason == "length" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": [self.message("completed")] if done else [],
            "output_text": "".join(self.text) if done else "",
            "usage": self.usage() if done else None,
            "incomplete_details": incomplete,
            "error": None,
            "instructions": self.request.instructions,
            "max_output_tokens": self.request.max_output_tokens,
            "temperature": self.request.temperature,
            "top_p": self.request.top_p,
            "previous_response_id": None,
            "parallel_tool_calls": False,
            "tool_choice": "none",
            "tools": [],
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "store": False,
            "metadata": {},
        }

    def usage(self) -> dict[str, Any]:
        return {
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": self.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def end(self, delta: Delta) -> str:
        """Take the reply's last item; the status the response ends with."""
        self.completion_tokens = delta.completion_tokens
        self.finish_reason = delta.finish_reason
        return "incomplete" if delta.finish_reason == "length" else "completed"


Stream = tk.DeploymentResponseGenerator[Delta]


async def answer(reply: Reply, stream: Stream) -> dict[str, Any]:
    """The whole response, once the reply has ended."""
    status = "completed"
    try:
        async for delta in stream:
            reply.text.append(delta.text)
            if delta.finish_reason is not None:
                status = reply.end(delta)
    finally:
        stream.cancel()  # a client that left early stops the model's work too
    return reply.response(status)


# --8<-- [start:streamed]
def streamed(reply: Reply, stream: Stream, request_id: str) -> tk.EventStream:
    """The response as Responses API events, each named by its ``type``; one still open at
    the ingress replica's drain deadline ends with the error that says retry."""
    return tk.EventStream(
        _events(reply, stream, request_id),
        ids=False,
        final_event=lambda: tk.OpenAIErrorEvent.restarting().responses(reply.next_number()),
    )


# --8<-- [end:streamed]


async def _events(reply: Reply, stream: Stream, request_id: str) -> AsyncIterator[object]:
    event = reply.event
    where = {"item_id": reply.message_id, "output_index": 0, "content_index": 0}
    yield event("response.created", response=reply.response("in_progress"))
    yield event("response.in_progress", response=reply.response("in_progress"))
    yield event("response.output_item.added", output_index=0, item=reply.message("in_progress"))
    yield event(
        "response.content_part.added", **where, part={"type": "output_text", "text": "", "annotations": []}
    )
    status = "completed"
    try:
        async for delta in stream:
            if delta.text:
                reply.text.append(delta.text)
                yield event("response.output_text.delta", **where, delta=delta.text, logprobs=[])
            if delta.finish_reason is not None:
                status = reply.end(delta)
    except ANSWERED as exc:  # an error event every client raises (its model replica went away...)
        yield stream_error(exc).responses(reply.next_number())
        return
    except Exception:
        logger.exception("Request %s: the response stream failed", request_id)
        failed = {**reply.response("failed"), "output": [], "usage": None}
        failed["error"] = {"code": "server_error", "message": f"The model failed (request id {request_id})."}
        yield event("response.failed", response=failed)
        return
    finally:
        stream.cancel()  # the client left early: the model stops this reply
    yield event("response.output_text.done", **where, text="".join(reply.text), logprobs=[])
    yield event("response.content_part.done", **where, part=reply.part())
    yield event("response.output_item.done", output_index=0, item=reply.message("completed"))
    yield event(f"response.{status}", response=reply.response(status))
