"""``/v1/chat/completions``: a request to a :class:`Generation`, and the reply back as a
``chat.completion`` or a stream of ``chat.completion.chunk`` objects."""

from __future__ import annotations

import time
import uuid
from typing import Any

import app_toolkit as tk
from app_toolkit.llm.events import Delta, Generation
from app_toolkit.llm.openai import logprobs
from app_toolkit.llm.openai.replies import Stream, Whole, dumps, relayed, usage
from app_toolkit.llm.protocol import ChatCompletionRequest

#: Temperature when a request names none (OpenAI's default).
DEFAULT_TEMPERATURE = 1.0


def generation(request: ChatCompletionRequest, received_at: float) -> Generation:
    """What the model's replica produces for ``request``."""
    given = request.max_completion_tokens or request.max_tokens
    return Generation(
        sampling=request.sampling(given, DEFAULT_TEMPERATURE),
        messages=tuple(request.messages),
        max_tokens_given=given is not None,
        stops=request.stops,
        response_format=request.response_format,
        tools=tuple(request.tools or ()),
        tool_choice=request.tool_choice,
        parallel_tool_calls=bool(request.parallel_tool_calls),
        received_at=received_at,
        template_kwargs=request.chat_template_kwargs,
    )


def completion(whole: Whole, model: str, with_logprobs: bool = False) -> dict[str, Any]:
    """The ``chat.completion`` object of a reply read whole (``with_logprobs``: the
    request asked for them)."""
    message: dict[str, Any] = {"role": "assistant", "content": whole.text or None, "refusal": None}
    if whole.tool_calls:
        message["tool_calls"] = whole.tool_calls
    else:
        message["content"] = whole.text
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": logprobs.chat(whole.logprobs) if with_logprobs else None,
                "finish_reason": whole.finish_reason,
            }
        ],
        "usage": usage(whole.prompt_tokens, whole.completion_tokens),
    }


def streamed(
    first: Delta, stream: Stream, model: str, include_usage: bool, with_logprobs: bool = False
) -> tk.EventStream:
    """The reply as OpenAI streams it: the assistant's role first, a chunk per piece (with
    its tokens' log-probabilities when asked), the finish reason, the usage chunk if asked
    (``stream_options.include_usage``), ``[DONE]``."""
    head = (
        f'{{"id":"chatcmpl-{uuid.uuid4().hex}","object":"chat.completion.chunk",'
        f'"created":{int(time.time())},"model":{dumps(model)},"choices":'
    )
    tail = ',"usage":null}' if include_usage else "}"

    def chunk(delta: dict[str, Any], reason: str | None = None, of: Delta | None = None) -> str:
        shown = logprobs.chat(of.logprobs) if with_logprobs and of is not None and of.logprobs else None
        choice = {"index": 0, "delta": delta, "logprobs": shown, "finish_reason": reason}
        return f"{head}[{dumps(choice)}]{tail}"

    def piece(delta: Delta) -> str | None:
        if delta.tool_calls:
            calls: dict[str, Any] = {"tool_calls": list(delta.tool_calls)}
            return chunk({"content": delta.text, **calls} if delta.text else calls, of=delta)
        return chunk({"content": delta.text}, of=delta) if delta.text or delta.logprobs else None

    def last(delta: Delta) -> list[str]:
        chunks = [chunk({}, delta.finish_reason, delta)]
        if include_usage:
            chunks.append(f'{head}[],"usage":{dumps(usage(first.prompt_tokens, delta.completion_tokens))}}}')
        return chunks

    return relayed(stream, [chunk({"role": "assistant", "content": ""})], piece, last)
