"""``/v1/completions``: a prompt to a :class:`Generation`, and the reply back as a
``text_completion`` object or a stream of them."""

from __future__ import annotations

import time
import uuid
from typing import Any

import app_toolkit as tk
from app_toolkit.llm.events import Delta, Generation
from app_toolkit.llm.openai import logprobs
from app_toolkit.llm.openai.replies import Stream, Whole, dumps, relayed, usage
from app_toolkit.llm.protocol import CompletionRequest

DEFAULT_TEMPERATURE = 1.0


def generation(request: CompletionRequest, received_at: float) -> Generation:
    prompt = request.single_prompt()
    return Generation(
        sampling=request.sampling(request.max_tokens, DEFAULT_TEMPERATURE),  # 16 unless given
        prompt=prompt if isinstance(prompt, str) else tuple(prompt),
        max_tokens_given=request.max_tokens is not None and "max_tokens" in request.model_fields_set,
        stops=request.stops,
        received_at=received_at,
    )


def completion(whole: Whole, model: str, echoed: str, with_logprobs: bool = False) -> dict[str, Any]:
    shown = logprobs.completion(whole.logprobs, len(echoed)) if with_logprobs else None
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "text": echoed + whole.text, "logprobs": shown, "finish_reason": whole.finish_reason}
        ],
        "usage": usage(whole.prompt_tokens, whole.completion_tokens),
    }


def streamed(
    first: Delta, stream: Stream, model: str, include_usage: bool, echoed: str, with_logprobs: bool = False
) -> tk.EventStream:
    head = (
        f'{{"id":"cmpl-{uuid.uuid4().hex}","object":"text_completion",'
        f'"created":{int(time.time())},"model":{dumps(model)},"choices":'
    )
    tail = ',"usage":null}' if include_usage else "}"

    offset = len(echoed)  # where the next chunk's tokens start in the choice's text

    def chunk(text: str, reason: str | None = None, of: Delta | None = None) -> str:
        nonlocal offset
        shown = None
        if with_logprobs and of is not None and of.logprobs:
            shown = logprobs.completion(of.logprobs, offset)
            offset += sum(len(entry.token) for entry in of.logprobs)
        choice = {"index": 0, "text": text, "logprobs": shown, "finish_reason": reason}
        return f"{head}[{dumps(choice)}]{tail}"

    def piece(delta: Delta) -> str | None:
        return chunk(delta.text, of=delta) if delta.text or delta.logprobs else None

    def last(delta: Delta) -> list[str]:
        chunks = [chunk("", delta.finish_reason, delta)]
        if include_usage:
            chunks.append(f'{head}[],"usage":{dumps(usage(first.prompt_tokens, delta.completion_tokens))}}}')
        return chunks

    return relayed(stream, [chunk(echoed)] if echoed else [], piece, last)
