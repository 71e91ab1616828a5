"""A reply from a model's replica as the ingress reads it: opened so that a refusal is an
HTTP error before any byte is sent, then read whole or relayed as a stream of chunks."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from sse_starlette import ServerSentEvent

import app_toolkit as tk
from app_toolkit.llm.errors import ANSWERED, as_openai_error, stream_error
from app_toolkit.llm.events import Delta, Generation, TokenLogprob
from app_toolkit.llm.openai_shapes import ToolCall, UnsetFields, Usage
from app_toolkit.streaming import OpenAIErrorEvent

if TYPE_CHECKING:
    from app_toolkit.llm.tool_calls import Fragment

logger = logging.getLogger("app_toolkit.llm")


class Stream(Protocol):
    """A model deployment's reply: the :class:`~app_toolkit.llm.events.Delta` items its
    ``generate`` streams (a handle's ``DeploymentResponseGenerator``, or one that charges
    its caller's API key: :class:`Metered`)."""

    def __aiter__(self) -> AsyncIterator[Delta]: ...

    def __anext__(self) -> Awaitable[Delta]: ...

    def cancel(self) -> None: ...


class Metered:
    """A reply's stream that charges its tokens once it ends, is cancelled or fails:
    the prompt's, and each choice's completion tokens as its last piece counted them (its
    finish, or for a choice cut before it, the tokens produced by the piece that came last;
    a piece that counts none, of a model of one's own, counts one)."""

    def __init__(self, stream: Stream, prompt_tokens: int, charge: Callable[[int], None]) -> None:
        self._stream = stream
        self._charge: Callable[[int], None] | None = charge
        self._prompt_tokens = prompt_tokens
        self._finished: dict[int, int] = {}  # choice -> its completion tokens
        self._pieces: dict[int, int] = {}  # choice -> its tokens as its pieces counted them

    def __aiter__(self) -> Metered:
        return self

    async def __anext__(self) -> Delta:
        try:
            delta = await anext(self._stream)
        except BaseException:
            self._settle()
            raise
        if delta.finish_reason is not None:
            self._finished[delta.index] = delta.completion_tokens
        elif delta.text or delta.tool_calls or delta.reasoning:
            counted = self._pieces.get(delta.index, 0)
            self._pieces[delta.index] = max(delta.completion_tokens, counted + 1)
        return delta

    def cancel(self) -> None:
        self._stream.cancel()
        self._settle()

    def _settle(self) -> None:
        charge, self._charge = self._charge, None
        if charge is None:
            return
        cut = sum(count for index, count in self._pieces.items() if index not in self._finished)
        try:
            charge(self._prompt_tokens + sum(self._finished.values()) + cut)
        except Exception:  # a charge never changes how the reply ends
            logger.exception("A reply's tokens could not be charged")


async def open_reply(
    model: tk.DeploymentHandle, generation: Generation | object, charge: Callable[[int], None] | None = None
) -> tuple[Delta, Stream]:
    """Start a reply on the model's replicas; its first item (the prompt's size) is read
    here, so a refusal becomes an HTTP error before any response byte is sent.

    ``generation`` is what the model's ``generate`` takes: a :class:`Generation`, or an
    app's own request to a model of its own that streams :class:`Delta` items. With
    ``charge``, the reply's tokens are passed to it once it ends (:class:`Metered`), as
    ``lambda tokens: tk.charge_tokens(request, tokens)`` charges the caller's API key."""
    stream: tk.DeploymentResponseGenerator[Delta] = model.options(method_name="generate", stream=True).remote(
        generation
    )
    try:
        first = await anext(stream)
    except ANSWERED as exc:
        stream.cancel()
        raise as_openai_error(exc) from None
    except BaseException:
        stream.cancel()
        raise
    return first, (stream if charge is None else Metered(stream, first.prompt_tokens, charge))


@dataclass
class Whole:
    """A reply read to its end."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    #: vLLM's reasoning parser's part of the reply ("": none).
    reasoning: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    logprobs: list[TokenLogprob] = field(default_factory=list)
    stop_reason: str | int | None = None
    #: The reply's tokens a reasoning parser counted as reasoning (None: none counted).
    reasoning_tokens: int | None = None


async def read_whole(first: Delta, stream: Stream) -> Whole:
    """The reply's text, reasoning and tool calls, joined (tool-call fragments merged by index)."""
    return (await read_choices(first, stream, 1))[0]


async def read_choices(first: Delta, stream: Stream, count: int) -> list[Whole]:
    """Each of the ``count`` replies (choices) read whole, in index order (each counts the
    prompt tokens of the whole request, as its usage does)."""
    wholes = [Whole(prompt_tokens=first.prompt_tokens) for _ in range(count)]
    texts: list[list[str]] = [[] for _ in wholes]
    reasonings: list[list[str]] = [[] for _ in wholes]
    try:
        async for delta in stream:
            whole = wholes[delta.index]
            texts[delta.index].append(delta.text)
            reasonings[delta.index].append(delta.reasoning)
            whole.logprobs.extend(delta.logprobs)
            for fragment in delta.tool_calls:
                _merge(whole.tool_calls, fragment)
            if delta.finish_reason is not None:
                whole.finish_reason = delta.finish_reason
                whole.completion_tokens = delta.completion_tokens
                whole.stop_reason = delta.stop_reason
                whole.reasoning_tokens = delta.reasoning_tokens
    except ANSWERED as exc:
        raise as_openai_error(exc) from None
    finally:
        stream.cancel()  # a client that left early stops the model's work too
    for whole, pieces, reasoning in zip(wholes, texts, reasonings, strict=True):
        whole.text = "".join(pieces)
        whole.reasoning = "".join(reasoning)
    return wholes


def _merge(calls: list[ToolCall], fragment: Fragment) -> None:
    index = fragment["index"]
    while len(calls) <= index:
        calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    call = calls[index]
    call["id"] = fragment.get("id") or call["id"]
    function = fragment.get("function") or {}
    call["function"]["name"] += function.get("name") or ""
    call["function"]["arguments"] += function.get("arguments") or ""


def usage(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int | None = None) -> Usage:
    """OpenAI's ``usage`` object: the two counts and their total, and where a reasoning
    parser counted them (not None), the reasoning's tokens, as vLLM's server gives them."""
    counted: Usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if reasoning_tokens is not None:
        counted["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return counted


def reasoning_counted(counts: Sequence[int | None]) -> int | None:
    """The reasoning tokens of several choices: their sum, None where none was counted."""
    given = [count for count in counts if count is not None]
    return sum(given) if given else None


#: The fields OpenAI's replies carry that this server has no value for (vLLM's are null too).
UNSET_FIELDS: UnsetFields = {"service_tier": None, "system_fingerprint": None}


def relayed(
    stream: Stream,
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
    stream: Stream,
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
            if delta.text or delta.tool_calls or delta.reasoning:  # the reply's last text came with its end
                piece = chunk(dataclasses.replace(delta, finish_reason=None))
                if piece is not None:
                    yield piece
                delta = dataclasses.replace(delta, text="", tool_calls=(), reasoning="", logprobs=())
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
