"""``/v1/chat/completions``: a request to a :class:`Generation`, and the reply back as a
``chat.completion`` or a stream of ``chat.completion.chunk`` objects."""

from __future__ import annotations

import time
import uuid
from typing import TypedDict

import app_toolkit as tk
from app_toolkit.llm.events import Delta, Generation, reply_format_asked
from app_toolkit.llm.openai import logprobs
from app_toolkit.llm.openai.replies import (
    UNSET_FIELDS,
    Stream,
    Whole,
    dumps,
    reasoning_counted,
    relayed,
    usage,
)
from app_toolkit.llm.openai_shapes import (
    AssistantMessage,
    ChatChunkChoice,
    ChatChunkDelta,
    ChatCompletion,
    UnsetFields,
)
from app_toolkit.llm.protocol import ChatCompletionRequest

#: Temperature when a request names none (OpenAI's default).
DEFAULT_TEMPERATURE = 1.0


class _VllmStop(TypedDict, total=False):
    """vLLM's ``stop_reason``, which a choice carries with ``vllm_fields`` only."""

    stop_reason: str | int | None


def generation(request: ChatCompletionRequest, received_at: float) -> Generation:
    """What the model's replica produces for ``request``."""
    given = request.max_completion_tokens or request.max_tokens
    return Generation(
        sampling=request.sampling(given, DEFAULT_TEMPERATURE),
        messages=tuple(request.messages),
        max_tokens_given=given is not None,
        stops=request.stops,
        include_stop_str_in_output=request.include_stop_str_in_output,
        skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        response_format=reply_format_asked(request.response_format, request.structured_outputs),
        tools=tuple(request.tools or ()),
        tool_choice=request.tool_choice,
        parallel_tool_calls=request.parallel_tool_calls,
        received_at=received_at,
        n=request.n,
        template_kwargs=request.chat_template_kwargs,
        add_generation_prompt=request.add_generation_prompt,
        continue_final_message=request.continue_final_message,
        include_reasoning=request.include_reasoning,
        parse="streamed" if request.stream else "whole",
    )


def completion(
    wholes: Whole | list[Whole],
    model: str,
    with_logprobs: bool = False,
    vllm_fields: bool = False,
    role: str = "assistant",
) -> ChatCompletion:
    """The ``chat.completion`` object of the replies read whole, one choice each (one
    reply: a Whole, as projects made from the chat template pass it); ``with_logprobs``:
    the request asked for them; ``vllm_fields``: with vLLM's ``stop_reason`` and OpenAI's
    null ``service_tier`` and ``system_fingerprint``, as ``build_openai_app`` answers (a
    project made from the chat template answers without them); ``role``: the messages'
    (:func:`reply_role`)."""
    if isinstance(wholes, Whole):
        wholes = [wholes]
    extra: UnsetFields = UNSET_FIELDS if vllm_fields else {}
    answer: ChatCompletion = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": index,
                "message": _message(whole, role),
                "logprobs": logprobs.chat(whole.logprobs) if with_logprobs else None,
                "finish_reason": whole.finish_reason,
                **(_VllmStop(stop_reason=whole.stop_reason) if vllm_fields else _VllmStop()),
            }
            for index, whole in enumerate(wholes)
        ],
        **extra,
        "usage": usage(
            wholes[0].prompt_tokens,
            sum(whole.completion_tokens for whole in wholes),
            reasoning_counted([whole.reasoning_tokens for whole in wholes]),
        ),
    }
    return answer


def reply_role(request: ChatCompletionRequest) -> str:
    """The role a reply's message has: the assistant's, or, without a generation prompt
    (the reply goes on with the conversation's last message), that message's, as vLLM
    answers."""
    if request.add_generation_prompt:
        return "assistant"
    return str(request.messages[-1].get("role") or "assistant")


def _message(whole: Whole, role: str) -> AssistantMessage:
    """A choice's message: its text (null beside tool calls or reasoning when it has none,
    as vLLM's parsers leave it) and tool calls, and vLLM's ``reasoning`` when it has some."""
    message: AssistantMessage = {"role": role, "content": whole.text or None, "refusal": None}
    if whole.tool_calls:
        message["tool_calls"] = whole.tool_calls
    elif not whole.reasoning:
        message["content"] = whole.text
    if whole.reasoning:
        message["reasoning"] = whole.reasoning
    return message


def streamed(
    first: Delta,
    stream: Stream,
    model: str,
    include_usage: bool,
    with_logprobs: bool = False,
    n: int = 1,
    vllm_fields: bool = False,
    role: str = "assistant",
) -> tk.EventStream:
    """The replies as OpenAI streams them: the assistant's role first (per choice), a chunk
    per piece (with its tokens' log-probabilities when asked), each choice's finish reason,
    once every choice is done the usage chunk if asked (``stream_options.include_usage``),
    ``[DONE]``."""
    head = (
        f'{{"id":"chatcmpl-{uuid.uuid4().hex}","object":"chat.completion.chunk",'
        f'"created":{int(time.time())},"model":{dumps(model)},"choices":'
    )
    tail = ',"usage":null}' if include_usage else "}"
    ended: list[int] = []  # each ended choice's completion tokens
    reasoned: list[int | None] = []  # and its reasoning tokens, where counted

    def chunk(delta: ChatChunkDelta, index: int, reason: str | None = None, of: Delta | None = None) -> str:
        shown = logprobs.chat(of.logprobs) if with_logprobs and of is not None and of.logprobs else None
        choice: ChatChunkChoice = {"index": index, "delta": delta, "logprobs": shown, "finish_reason": reason}
        if vllm_fields and reason is not None and of is not None:
            choice["stop_reason"] = of.stop_reason
        return f"{head}[{dumps(choice)}]{tail}"

    def piece(delta: Delta) -> str | None:
        shown: ChatChunkDelta = {}
        if delta.reasoning:
            shown["reasoning"] = delta.reasoning
        if delta.text or not (delta.reasoning or delta.tool_calls):
            shown["content"] = delta.text
        if delta.tool_calls:
            shown["tool_calls"] = list(delta.tool_calls)
        if delta.text or delta.reasoning or delta.tool_calls or delta.logprobs:
            return chunk(shown, delta.index, of=delta)
        return None

    def last(delta: Delta) -> list[str]:
        chunks = [chunk({}, delta.index, delta.finish_reason, delta)]
        ended.append(delta.completion_tokens)
        reasoned.append(delta.reasoning_tokens)
        if include_usage and len(ended) == n:
            counted = usage(first.prompt_tokens, sum(ended), reasoning_counted(reasoned))
            chunks.append(f'{head}[],"usage":{dumps(counted)}}}')
        return chunks

    opening = [chunk({"role": role, "content": ""}, index) for index in range(n)]
    return relayed(stream, opening, piece, last)
