"""A reply from a model's replica as the ingress reads it: opened so that a refusal is an
HTTP error before any byte is sent, then read whole or relayed as a stream of chunks."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sse_starlette import ServerSentEvent

import app_toolkit as tk
from app_toolkit.llm.choices import merged
from app_toolkit.llm.errors import ANSWERED, as_openai_error, stream_error
from app_toolkit.llm.events import Delta, Generation, TokenLogprob
from app_toolkit.streaming import OpenAIErrorEvent

logger = logging.getLogger("app_toolkit.llm")

Stream = tk.DeploymentResponseGenerator[Delta]


class Replies(Protocol):
    """What the ingress reads a reply from: a model's stream of deltas, or several as one."""

    def __aiter__(self) -> AsyncIterator[Delta]: ...

    def cancel(self) -> None:
        """The model stops producing it (the client left, or it was read)."""


class Joined:
    """Several replies (a completion's prompts) read as one: their pieces as they come,
    reply ``i``'s choices numbered from ``i * n`` as vLLM numbers them."""

    def __init__(self, streams: Sequence[Stream], n: int) -> None:
        self._streams = list(streams)
        self._deltas = merged(self._streams, [index * n for index in range(len(self._streams))])
        self._closing: asyncio.Future[None] | None = None

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._deltas

    def cancel(self) -> None:
        for stream in self._streams:
            stream.cancel()
        # Its readers stop at once (not when collected): none waits on a piece nobody takes.
        self._closing = asyncio.ensure_future(self._deltas.aclose())


async def open_replies(
    model: tk.DeploymentHandle, generations: Sequence[Generation]
) -> tuple[list[Delta], Replies]:
    """:func:`open_reply` for each generation, at once; the first refusal cancels the others
    and is the HTTP error. One generation's reply is read as it is; several, joined."""
    opened = await asyncio.gather(
        *(open_reply(model, generation) for generation in generations), return_exceptions=True
    )
    failed = [outcome for outcome in opened if isinstance(outcome, BaseException)]
    if failed:
        for outcome in opened:
            if not isinstance(outcome, BaseException):
                outcome[1].cancel()
        raise failed[0]
    firsts = [outcome[0] for outcome in opened if not isinstance(outcome, BaseException)]
    streams = [outcome[1] for outcome in opened if not isinstance(outcome, BaseException)]
    return firsts, streams[0] if len(streams) == 1 else Joined(streams, generations[0].n)


async def open_reply(model: tk.DeploymentHandle, generation: Generation | object) -> tuple[Delta, Stream]:
    """Start a reply on the model's replicas; its first item (the prompt's size) is read
    here, so a refusal becomes an HTTP error before any response byte is sent.

    ``generation`` is what the model's ``generate`` takes: a :class:`Generation`, or an
    app's own request to a model of its own that streams :class:`Delta` items."""
    stream: Stream = model.options(method_name="generate", stream=True).remote(generation)
    try:
        return await anext(stream), stream
    except ANSWERED as exc:
        stream.cancel()
        raise as_openai_error(exc) from None
    except BaseException:
        stream.cancel()
        raise


@dataclass
class Whole:
    """A reply read to its end."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    logprobs: list[TokenLogprob] = field(default_factory=list)
    stop_reason: str | int | None = None


async def read_whole(first: Delta, stream: Replies) -> Whole:
    """The reply's text and tool calls, joined (tool-call fragments merged by index)."""
    return (await read_choices(first, stream, 1))[0]


async def read_choices(first: Delta | Sequence[Delta], stream: Replies, n: int) -> list[Whole]:
    """Each of the ``n`` replies (choices) to each prompt read whole, in index order (one
    first delta per prompt: each choice counts its prompt's tokens)."""
    firsts = [first] if isinstance(first, Delta) else list(first)
    wholes = [Whole(prompt_tokens=firsts[index // n].prompt_tokens) for index in range(len(firsts) * n)]
    texts: list[list[str]] = [[] for _ in wholes]
    try:
        async for delta in stream:
            whole = wholes[delta.index]
            texts[delta.index].append(delta.text)
            whole.logprobs.extend(delta.logprobs)
            for fragment in delta.tool_calls:
                _merge(whole.tool_calls, fragment)
            if delta.finish_reason is not None:
                whole.finish_reason = delta.finish_reason
                whole.completion_tokens = delta.completion_tokens
                whole.stop_reason = delta.stop_reason
    except ANSWERED as exc:
        raise as_openai_error(exc) from None
    finally:
        stream.cancel()  # a client that left early stops the model's work too
    for whole, pieces in zip(wholes, texts, strict=True):
        whole.text = "".join(pieces)
    return wholes


def _merge(calls: list[dict[str, Any]], fragment: dict[str, Any]) -> None:
    index = fragment["index"]
    while len(calls) <= index:
        calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    call = calls[index]
    call["id"] = fragment.get("id") or call["id"]
    function = fragment.get("function") or {}
    call["function"]["name"] += function.get("name") or ""
    call["function"]["arguments"] += function.get("arguments") or ""


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


#: The fields OpenAI's replies carry that this server has no value for (vLLM's are null too).
UNSET_FIELDS: dict[str, Any] = {"service_tier": None, "system_fingerprint": None}


def relayed(
    stream: Replies,
    opening: list[str],
    chunk: Callable[[Delta], str | None],
    last: Callable[[Delta], list[str]],
) -> tk.EventStream:
    """The reply as an OpenAI chunk stream: ``opening``'s chunks, the ``data`` of each
    delta (``chunk``; None sends nothing), the last delta's chunks (``last``), then
    ``[DONE]``. A reply cut off ends with an error event and no ``[DONE]``, as OpenAI's
    streams do; one still open at the ingress's drain deadline, with the restart error.
    A client that leaves, at any point, cancels the model's reply."""
    return tk.EventStream(
        _events(stream, opening, chunk, last),
        ids=False,
        final_event=lambda: OpenAIErrorEvent.restarting().chat_completions(),
        end_at_drain=False,
    )


async def _events(
    stream: Replies,
    opening: list[str],
    chunk: Callable[[Delta], str | None],
    last: Callable[[Delta], list[str]],
) -> AsyncGenerator[str | ServerSentEvent, None]:
    try:
        for data in opening:
            yield data
        async for delta in stream:
            if delta.finish_reason is None:
                piece = chunk(delta)
                if piece is not None:
                    yield piece
                continue
            for data in last(delta):
                yield data
    except ANSWERED as exc:
        logger.warning("Request %s: the reply was cut off: %s", tk.get_request_id(), exc)
        yield stream_error(exc).chat_completions()
        return
    except Exception:
        logger.exception("Request %s: the reply failed", tk.get_request_id())
        request_id = tk.get_request_id()
        yield OpenAIErrorEvent(
            f"The model failed mid-reply (request id {request_id}).", None
        ).chat_completions()
        return
    finally:
        stream.cancel()  # the client left early (or the reply ended): the model stops this reply
    yield "[DONE]"


def dumps(value: object) -> str:
    """Compact JSON, as OpenAI's servers write it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
