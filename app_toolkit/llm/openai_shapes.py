"""OpenAI's JSON shapes, as this package reads them from clients and writes them back: the
types of the dicts that cross ``app_toolkit.llm``'s modules (typing only: at run time
each is a plain ``dict``).

What a client sends is validated as a JSON object and nothing more (:data:`JSONObject`,
:data:`ChatMessage`): its values are read with ``isinstance`` or passed on. What this
server writes has a fixed shape: a ``TypedDict`` named after the object it types
(``ChatCompletion``, ``TextCompletion``, the Responses API's ``ResponseObject``...); a key
marked ``NotRequired`` is left out of some answers (vLLM's extras: ``stop_reason``...).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NotRequired, TypedDict

#: A JSON object a client sent (``tools``, ``response_format``, a content part), validated
#: as an object and nothing more: its values are checked with ``isinstance``, or passed on.
JSONObject = dict[str, object]

#: A chat message as the client sent it (``role``, ``content`` and, in Chat Completions,
#: ``tool_calls``, ``tool_call_id``, ``name``...), read through its keys, never changed.
ChatMessage = Mapping[str, object]


class TextMessage(TypedDict):
    """A chat message whose content is text, as this server makes one (a Responses API
    input item, a kept response's reply)."""

    role: str
    content: str


class FunctionCall(TypedDict):
    """A tool call's function: its name and its arguments' JSON text."""

    name: str
    arguments: str


class ToolCall(TypedDict):
    """A whole tool call of a reply's message (``message.tool_calls`` items); streamed,
    it comes as fragments (``delta.tool_calls`` items) a reader merges by ``index``."""

    id: str
    type: str  # "function"
    function: FunctionCall


class TopLogprob(TypedDict):
    """One token in chat's ``logprobs``: its text, log-probability and bytes."""

    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    """A reply's token in chat's ``logprobs.content``, with the likeliest tokens there."""

    top_logprobs: list[TopLogprob]


class ChatLogprobs(TypedDict):
    """A chat choice's ``logprobs``."""

    content: list[ChatTokenLogprob]


class CompletionLogprobs(TypedDict):
    """A completion choice's ``logprobs``: four lists, one item per token."""

    text_offset: list[int]
    token_logprobs: list[float]
    tokens: list[str]
    top_logprobs: list[dict[str, float]]


class UnsetFields(TypedDict, total=False):
    """The fields OpenAI's replies carry that this server has no value for."""

    service_tier: None
    system_fingerprint: None


class AssistantMessage(TypedDict):
    """A chat choice's ``message``: text, or tool calls (``content`` null); with vLLM's
    ``reasoning`` where its reasoning parser found some."""

    role: str
    content: str | None
    refusal: None
    tool_calls: NotRequired[list[ToolCall]]
    reasoning: NotRequired[str]


class ChatChoice(TypedDict):
    """One choice of a ``chat.completion``."""

    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str
    stop_reason: NotRequired[str | int | None]  # vLLM's


class CompletionTokensDetails(TypedDict):
    reasoning_tokens: int


class Usage(TypedDict):
    """A reply's ``usage``: ``completion_tokens_details`` where a reasoning parser counted
    the reasoning's tokens (vLLM's)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: NotRequired[CompletionTokensDetails]


class ChatCompletion(TypedDict):
    """A ``chat.completion`` object: the replies read whole."""

    id: str
    object: str  # "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    service_tier: NotRequired[None]
    system_fingerprint: NotRequired[None]
    usage: Usage


class ChatChunkDelta(TypedDict, total=False):
    """A ``chat.completion.chunk`` choice's ``delta``: the role first, then text, vLLM's
    ``reasoning`` or tool-call fragments (passed on as the model's replica made them);
    empty at the end."""

    role: str
    content: str
    reasoning: str
    tool_calls: Sequence[Mapping[str, object]]


class ChatChunkChoice(TypedDict):
    """One choice of a ``chat.completion.chunk``."""

    index: int
    delta: ChatChunkDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: NotRequired[str | int | None]  # vLLM's, with the finish reason


class CompletionChoice(TypedDict):
    """One choice of a ``text_completion``, whole or streamed (``finish_reason`` null
    until the last chunk, which carries ``stop_reason``)."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    stop_reason: NotRequired[str | int | None]  # vLLM's


class TextCompletion(TypedDict):
    """A ``text_completion`` object: the replies read whole."""

    id: str
    object: str  # "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    service_tier: NotRequired[None]
    system_fingerprint: NotRequired[None]
    usage: Usage


class ModelEntry(TypedDict):
    """One model (or LoRA adapter) in ``/v1/models``, with vLLM's fields."""

    id: str
    object: str  # "model"
    created: int
    owned_by: str
    root: str
    parent: str | None
    max_model_len: int | None


class OutputText(TypedDict):
    """A Responses API message's text part."""

    type: str  # "output_text"
    text: str
    annotations: list[object]
    logprobs: list[object]


class OutputMessage(TypedDict):
    """A Responses API ``response``'s output item: the assistant's message."""

    id: str
    type: str  # "message"
    status: str
    role: str
    content: list[OutputText]


class ReasoningText(TypedDict):
    """A Responses API reasoning item's text part."""

    type: str  # "reasoning_text"
    text: str


class ReasoningItem(TypedDict):
    """A Responses API ``response``'s output item: what a reasoning parser split off the
    reply, as vLLM's server gives it (``content`` None until the item is done)."""

    id: str
    type: str  # "reasoning"
    summary: list[object]
    content: list[ReasoningText] | None
    encrypted_content: str | None
    status: str


class ResponseUsage(TypedDict):
    """A Responses API ``response``'s ``usage``."""

    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class ResponseObject(TypedDict):
    """A Responses API ``response`` object (``object``: "response")."""

    id: str
    object: str
    created_at: int
    status: str
    model: str
    output: list[OutputMessage | ReasoningItem]
    output_text: str
    usage: ResponseUsage | None
    incomplete_details: dict[str, str] | None
    error: dict[str, str | None] | None
    instructions: str | None
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    previous_response_id: str | None
    parallel_tool_calls: bool
    tool_choice: str
    tools: list[object]
    text: dict[str, object]
    truncation: str
    store: bool
    background: bool
    metadata: dict[str, str]
