"""``/v1/completions``: a prompt to a :class:`Generation`, and the reply back as a
``text_completion`` object or a stream of them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

import app_toolkit as tk
from app_toolkit.llm.events import Delta, Generation, reply_format_asked
from app_toolkit.llm.openai import logprobs
from app_toolkit.llm.openai.replies import UNSET_FIELDS, Stream, Whole, dumps, relayed, usage
from app_toolkit.llm.openai_shapes import CompletionChoice, TextCompletion
from app_toolkit.llm.protocol import CompletionRequest

DEFAULT_TEMPERATURE = 1.0


def generation(request: CompletionRequest, received_at: float) -> Generation:
    """What the model's replica produces: ``n`` choices to the prompt, or to each prompt of
    a list (the replica checks them all before it starts any)."""
    prompts = [prompt if isinstance(prompt, str) else tuple(prompt) for prompt in request.prompts()]
    return Generation(
        sampling=request.sampling(request.max_tokens, DEFAULT_TEMPERATURE),  # 16 unless given
        prompt=prompts[0] if len(prompts) == 1 else None,
        prompts=tuple(prompts) if len(prompts) > 1 else (),
        max_tokens_given=request.max_tokens is not None and "max_tokens" in request.model_fields_set,
        stops=request.stops,
        include_stop_str_in_output=request.include_stop_str_in_output,
        skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        response_format=reply_format_asked(None, request.structured_outputs),
        received_at=received_at,
        n=request.n,
    )


def completion(
    wholes: list[Whole], model: str, echoed: Sequence[str], with_logprobs: bool = False, n: int = 1
) -> TextCompletion:
    """The ``text_completion`` object of the replies read whole, one choice each: prompt
    ``i``'s ``n`` choices are ``i * n`` to ``i * n + n - 1``, each after its prompt's echo
    (``echoed``: one per prompt, "" without ``echo``)."""
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": index,
                "text": echoed[index // n] + whole.text,
                "logprobs": logprobs.completion(whole.logprobs, len(echoed[index // n]))
                if with_logprobs
                else None,
                "finish_reason": whole.finish_reason,
                "stop_reason": whole.stop_reason,
            }
            for index, whole in enumerate(wholes)
        ],
        **UNSET_FIELDS,
        "usage": usage(wholes[0].prompt_tokens, sum(whole.completion_tokens for whole in wholes)),
    }


def streamed(
    prompt_tokens: int,
    stream: Stream,
    model: str,
    include_usage: bool,
    echoed: Sequence[str],
    with_logprobs: bool = False,
    n: int = 1,
) -> tk.EventStream:
    """The replies as OpenAI streams them: each choice's echo first, a chunk per piece,
    each choice's finish reason, once every choice is done the usage chunk if asked,
    ``[DONE]`` (choices numbered as :func:`completion` numbers them)."""
    head = (
        f'{{"id":"cmpl-{uuid.uuid4().hex}","object":"text_completion",'
        f'"created":{int(time.time())},"model":{dumps(model)},"choices":'
    )
    tail = ',"usage":null}' if include_usage else "}"
    choices = len(echoed) * n
    offsets = [len(echoed[index // n]) for index in range(choices)]  # where each choice's next tokens start
    ended: list[int] = []  # each ended choice's completion tokens

    def chunk(text: str, index: int, reason: str | None = None, of: Delta | None = None) -> str:
        shown = None
        if with_logprobs and of is not None and of.logprobs:
            shown = logprobs.completion(of.logprobs, offsets[index])
            offsets[index] += sum(len(entry.token) for entry in of.logprobs)
        choice: CompletionChoice = {"index": index, "text": text, "logprobs": shown, "finish_reason": reason}
        if reason is not None and of is not None:
            choice["stop_reason"] = of.stop_reason
        return f"{head}[{dumps(choice)}]{tail}"

    def piece(delta: Delta) -> str | None:
        return chunk(delta.text, delta.index, of=delta) if delta.text or delta.logprobs else None

    def last(delta: Delta) -> list[str]:
        chunks = [chunk("", delta.index, delta.finish_reason, delta)]
        ended.append(delta.completion_tokens)
        if include_usage and len(ended) == choices:
            chunks.append(f'{head}[],"usage":{dumps(usage(prompt_tokens, sum(ended)))}}}')
        return chunks

    opening = [chunk(echoed[index // n], index) for index in range(choices) if echoed[index // n]]
    return relayed(stream, opening, piece, last)
