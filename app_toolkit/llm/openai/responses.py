"""``/v1/responses``: OpenAI's Responses API as the official client and the AI SDK read it —
a request to a :class:`Generation`, and the reply back as a ``response`` object
(:class:`Reply`). Its stream of events is
:mod:`~app_toolkit.llm.openai.response_events`'s; which responses are kept, and their
events for resuming a stream, :mod:`~app_toolkit.llm.openai.response_store`'s."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from app_toolkit.llm.errors import OpenAIError, bad_parameter
from app_toolkit.llm.events import Delta, Generation, reply_format_asked
from app_toolkit.llm.openai.chat import DEFAULT_TEMPERATURE
from app_toolkit.llm.openai.replies import Whole, dumps
from app_toolkit.llm.openai_shapes import (
    ChatMessage,
    JSONObject,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponseObject,
    ResponseUsage,
)
from app_toolkit.llm.protocol import (
    MAX_TEXT,
    MAX_TOKENS,
    OptionRules,
    SamplingFields,
    checked_options,
    role_of,
    text_content,
)
from app_toolkit.streaming import OpenAIErrorEvent

#: Options read no further: the default is accepted, anything else refused by name.
RULES = OptionRules(
    refused={
        "tools": (None, []),
        "tool_choice": (None, "none", "auto"),
        "reasoning": (None, {}),
        "top_logprobs": (None, 0),
        "conversation": (None,),
        "prompt": (None,),
        "max_tool_calls": (None,),
        "context_management": (None,),
    },
    ignored=frozenset(
        {
            "user",
            "metadata",
            "service_tier",
            "parallel_tool_calls",
            "safety_identifier",
            "prompt_cache_key",
            "prompt_cache_retention",
            "include",
            "truncation",
            "stream_options",
        }
    ),
)


#: The message a kept response's output item id names, as a chat message (None: an item
#: that adds nothing to the prompt, its reasoning); the second argument is the parameter
#: that named it (``input[2].id``), for the 404.
Referenced = Callable[[str, str], ChatMessage | None]


class InputItem(BaseModel):
    """An item of ``input``: a message (``type`` may be left out); other item types are
    refused by name when the request is read."""

    model_config = ConfigDict(extra="allow")  # id, status: sent back with earlier output

    type: str = Field("message", max_length=64)
    role: str | None = Field(None, max_length=64)
    content: str | list[JSONObject] | None = None


class ResponsesRequest(SamplingFields):
    """``POST /v1/responses``: what this server answers is a field (vLLM's sampling fields
    among them, as vLLM's server takes them here); other options are refused by name
    unless they change nothing (:data:`RULES`)."""

    model: str | None = None
    input: (
        Annotated[str, Field(max_length=MAX_TEXT)]
        | Annotated[list[InputItem], Field(min_length=1, max_length=2_000)]
    )
    instructions: str | None = Field(None, max_length=MAX_TEXT)
    stream: bool = False
    store: bool = True  # OpenAI's default: the response is kept
    background: bool = False
    previous_response_id: str | None = Field(None, max_length=200)
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    text: dict[str, Any] | None = None  # text.format's keys are read as sent: response_format()
    #: vLLM's: with a reasoning parser, False leaves the reasoning out of the response.
    include_reasoning: bool = True

    def checked(self) -> ResponsesRequest:
        if self.background:
            raise bad_parameter(
                "background",
                "Background responses are not supported by this server. Stream the response "
                "instead (stream: true, store: true): it goes on if the connection drops, and "
                "GET /v1/responses/{id}?stream=true&starting_after=<sequence_number> resumes it.",
                "unsupported_parameter",
            )
        checked_options(dict(self.model_extra or {}), RULES)
        if self.structured_outputs is not None and (self.text or {}).get("format") is not None:
            raise bad_parameter(
                "structured_outputs", "Cannot specify both structured_outputs and text.format"
            )
        return self

    def messages(self, referenced: Referenced) -> tuple[ChatMessage, ...]:
        """This request's input as chat messages (text parts joined by newlines); an
        ``item_reference`` (the AI SDK sends earlier replies so) is the message it names.
        Earlier reasoning, sent back as an item or by reference (clients that send a
        response's whole ``output`` back do), is left out of the prompt: vLLM does not
        carry a response's reasoning into the next turn either."""
        if isinstance(self.input, str):
            return ({"role": "user", "content": self.input},)
        messages = (_message(item, index, referenced) for index, item in enumerate(self.input))
        return tuple(message for message in messages if message is not None)

    def response_format(self) -> JSONObject | None:
        """``text.format`` as Chat Completions' ``response_format`` (None: plain text)."""
        given = (self.text or {}).get("format") or {"type": "text"}
        if not isinstance(given, dict):
            raise bad_parameter("text.format", "text.format must be an object with a type.")
        kind = given.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return {"type": "json_object"}
        if kind == "json_schema":
            schema = {key: given[key] for key in ("name", "schema", "strict", "description") if key in given}
            return {"type": "json_schema", "json_schema": schema}
        raise bad_parameter(
            "text.format.type",
            f"text.format of type {kind!r} is not supported; use text, json_object or json_schema.",
        )


def _message(item: InputItem, index: int, referenced: Referenced) -> ChatMessage | None:
    if item.type == "item_reference":
        return referenced(str((item.model_extra or {}).get("id", "")), f"input[{index}].id")
    if item.type == "reasoning":
        return None
    if item.type != "message":
        raise bad_parameter(
            f"input[{index}].type",
            f"Input items of type {item.type!r} are not supported: this server takes messages, "
            "item_reference and reasoning only (send earlier replies as assistant messages, or "
            "use previous_response_id).",
            "unsupported_parameter",
        )
    role = role_of(item.role or "", f"input[{index}].role")
    return {"role": role, "content": text_content(item.content, f"input[{index}].content")}


def generation(
    request: ResponsesRequest, conversation: tuple[ChatMessage, ...], received_at: float
) -> Generation:
    """What the model's replica produces: ``instructions`` as the system message, then
    ``conversation`` (an earlier response's, then this request's input)."""
    if not any(message["role"] == "user" for message in conversation):
        raise bad_parameter("input", "input holds no user message (nor does previous_response_id's).")
    system: tuple[ChatMessage, ...] = (
        ({"role": "system", "content": request.instructions},) if request.instructions else ()
    )
    given = request.max_output_tokens
    return Generation(
        sampling=request.sampled(
            given or MAX_TOKENS,
            DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
            1.0 if request.top_p is None else request.top_p,
        ),
        messages=system + conversation,
        max_tokens_given=given is not None,
        stops=request.stops,
        include_stop_str_in_output=request.include_stop_str_in_output,
        skip_special_tokens=request.skip_special_tokens,
        response_format=reply_format_asked(request.response_format(), request.structured_outputs),
        received_at=received_at,
        include_reasoning=request.include_reasoning,
        parse="streamed" if request.stream else "whole",
    )


#: Chat Completions' parameter names, as this API names them (a model's refusal names the former).
_PARAMS = (
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("messages", "input"),
)


def renamed(error: OpenAIError) -> OpenAIError:
    """A model's refusal, naming this API's parameter (``text.format``, ``input``)."""
    param = error.param or ""
    for chat, ours in _PARAMS:
        if param.startswith(chat):
            param = ours + param[len(chat) :]
            return OpenAIError(error.status, error.message, error.type, error.code, param)
    return error


class Event(NamedTuple):
    """One event of a streamed response: its ``type`` and its JSON."""

    kind: str
    data: str


class Reply:
    """One response as it grows: the same fields in every event and answer that carries it.
    ``conversation`` is what the model read but the instructions; a later request's
    ``previous_response_id`` continues it with this reply's text (:meth:`continued`: the
    reasoning is not carried, as vLLM does not carry it).

    Its output is the reasoning a reasoning parser split off (``engine_kwargs.
    reasoning_parser``), if any, as a ``reasoning`` item, then the message."""

    def __init__(
        self,
        request: ResponsesRequest,
        model: str,
        prompt_tokens: int,
        conversation: tuple[ChatMessage, ...],
    ) -> None:
        self.id = f"resp_{uuid.uuid4().hex}"
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.reasoning_id = f"rs_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.request = request
        self.model = model
        self.conversation = conversation
        self.prompt_tokens = prompt_tokens
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.completion_tokens = 0
        self.reasoning_tokens: int | None = None  # None: no reasoning parser counted them
        self.status = "in_progress"
        self.finish_reason: str | None = None
        self.error: dict[str, str | None] | None = None
        self.sequence = -1  # the sequence_number of the last event made

    @property
    def done(self) -> bool:
        return self.status != "in_progress"

    def continued(self) -> tuple[ChatMessage, ...]:
        """The conversation a later request continues: this one and its reply."""
        return (*self.conversation, {"role": "assistant", "content": "".join(self.text)})

    def next_number(self) -> int:
        """The sequence_number of the next event."""
        self.sequence += 1
        return self.sequence

    def event(self, kind: str, **fields: object) -> Event:
        return Event(kind, dumps({"type": kind, "sequence_number": self.next_number(), **fields}))

    def fail(self, message: str, code: str = "server_error") -> None:
        """The response ended without its reply."""
        self.status = "failed"
        self.error = {"code": code, "message": message}

    def error_event(self, error: OpenAIErrorEvent) -> Event:
        """The event that ends a stream cut off by ``error``; the response failed."""
        self.fail(error.message, error.code or "server_error")
        sent = error.responses(self.next_number())
        return Event(str(sent.event), str(sent.data))

    def part(self) -> OutputText:
        return {"type": "output_text", "text": "".join(self.text), "annotations": [], "logprobs": []}

    def message(self, status: str) -> OutputMessage:
        content = [self.part()] if status == "completed" else []
        return {
            "id": self.message_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def reasoning_part(self) -> ReasoningText:
        return {"type": "reasoning_text", "text": "".join(self.reasoning)}

    def reasoning_item(self, status: str) -> ReasoningItem:
        return {
            "id": self.reasoning_id,
            "type": "reasoning",
            "summary": [],
            "content": [self.reasoning_part()] if status == "completed" else None,
            "encrypted_content": None,
            "status": status,
        }

    def output(self) -> list[OutputMessage | ReasoningItem]:
        """The output of a response that ended: its reasoning (if any), then the message."""
        reasoning: list[OutputMessage | ReasoningItem] = (
            [self.reasoning_item("completed")] if self.reasoning else []
        )
        return [*reasoning, self.message("completed")]

    def response(self) -> ResponseObject:
        """The ``response`` object as it stands."""
        ended = self.status in ("completed", "incomplete")
        request = self.request
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "model": self.model,
            "output": self.output() if ended else [],
            "output_text": "".join(self.text) if ended else "",
            "usage": self.usage() if ended else None,
            "incomplete_details": {"reason": "max_output_tokens"} if self.status == "incomplete" else None,
            "error": self.error,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "previous_response_id": request.previous_response_id,
            "parallel_tool_calls": False,
            "tool_choice": "none",
            "tools": [],
            "text": {"format": (request.text or {}).get("format") or {"type": "text"}},
            "truncation": "disabled",
            "store": request.store,
            "background": False,
            "metadata": {},
        }

    def usage(self) -> ResponseUsage:
        return {
            "input_tokens": self.prompt_tokens,
            # cache_write_tokens: newer openai clients' types require it (vLLM 0.32 leaves it out).
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": self.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens or 0},
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def end(self, last: Delta) -> None:
        """Take the reply's last item (why it ended, the tokens it took)."""
        self.completion_tokens = last.completion_tokens
        self.reasoning_tokens = last.reasoning_tokens
        self.finish_reason = last.finish_reason
        self.status = "incomplete" if last.finish_reason == "length" else "completed"

    def read(self, whole: Whole) -> ResponseObject:
        """The response of a reply read whole."""
        self.text = [whole.text]
        self.reasoning = [whole.reasoning] if whole.reasoning else []
        self.end(
            Delta(
                completion_tokens=whole.completion_tokens,
                finish_reason=whole.finish_reason,
                reasoning_tokens=whole.reasoning_tokens,
            )
        )
        return self.response()
