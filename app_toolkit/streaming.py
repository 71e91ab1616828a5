"""Server-sent events done right by default, and OpenAI-compatible chat streams.

:class:`EventStream` wraps sse-starlette's ``EventSourceResponse``: ``Cache-Control:
no-cache``, ``X-Accel-Buffering: no`` (so proxies do not buffer), a comment heartbeat every
15 s, numbered event ids, and an end its clients understand when the replica drains: the
stream runs on until the drain's deadline (``graceful_shutdown_timeout_s``) and then ends
with a final event, or ends at once if its client resumes elsewhere losing nothing.
:class:`OpenAIErrorEvent` is the last event of an OpenAI stream that fails or is cut short.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.types import Message, Send

from app_toolkit._runtime import request_context
from app_toolkit.event_log import Following, LoggedEvent
from app_toolkit.exceptions import ReplicaUnavailableError

T = TypeVar("T")
logger = logging.getLogger("app_toolkit.streaming")

DRAIN_EVENT = ServerSentEvent(event="drain", data="server is shutting down; reconnect", retry=1000)

#: What a stream ends with at its replica's drain: an event, a callable that makes one
#: when the stream ends (or returns None), or None (no final event).
FinalEvent = ServerSentEvent | Callable[[], ServerSentEvent | None] | None

#: The ``code`` of the error an OpenAI stream ends with when its server restarts.
RESTART_CODE = "server_restarting"


class EventStream(EventSourceResponse):
    """An SSE response from an (async) iterable of events.

    Items may be strings (sent as ``data``), dicts of SSE fields (``data``, ``event``,
    ``id``, ``retry``), ``ServerSentEvent`` objects, an :class:`~app_toolkit.EventLog`'s
    events (with their ids: ``EventStream(await log.follow(stream, after=last_event_id))``;
    ``follow`` raises ``UnknownStream``, ``ValueError`` or ``StreamAbandoned`` before the
    stream starts, for the route to answer 404, 400 or 410), or any JSON-able value (sent
    as JSON).
    Events without an id get the next number (``ids=False`` turns that off).

    When its replica drains (a deploy replacing it, a scale-down, a delete), the stream
    runs on until the drain's deadline (``graceful_shutdown_timeout_s``) and then ends
    with ``final_event``: an SSE event, a callable that makes it then (a Responses API
    stream's error needs the next ``sequence_number``), or None. ``end_at_drain=True``
    ends it as soon as the drain starts instead, for a client that resumes elsewhere
    losing nothing, or an endless feed whose clients just reconnect (which would
    otherwise hold every drain for the whole grace period); None, the default, means
    True for an event log's events (their ids are what the client resumes after).
    """

    def __init__(
        self,
        events: AsyncIterable[object] | Iterable[object],
        *,
        ping_s: float = 15.0,
        ids: bool = True,
        final_event: FinalEvent = DRAIN_EVENT,
        end_at_drain: bool | None = None,
        headers: Mapping[str, str] | None = None,
        status_code: int = 200,
    ) -> None:
        super().__init__(
            _events(events, ids, final_event, end_at_drain),
            status_code=status_code,
            headers={"Cache-Control": "no-cache", **(headers or {})},
            ping=ping_s,
        )

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        """One send, as sse-starlette makes it (its releases from 3.4.10; earlier ones
        send inline), without the anyio cancel scope it opens around every send even when no
        ``send_timeout`` is set: about 11 µs a chunk, a chat stream's every token."""
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)


async def _events(
    events: AsyncIterable[object] | Iterable[object],
    ids: bool,
    final_event: FinalEvent,
    end_at_drain: bool | None,
) -> AsyncIterator[ServerSentEvent]:
    source = _as_async(events)
    signal = request_context.drain_signal.get()
    cut = _Cut()
    # Unless its author said: an event log's events end it at the drain's start (their ids
    # are what its client resumes after), from the start or from the first one it sends.
    resumable = end_at_drain is None
    at_start = isinstance(events, Following) if end_at_drain is None else end_at_drain
    watch = signal.watch(cut.now, at_start=at_start) if signal is not None else None
    number = 0
    try:
        while True:
            if watch is None:
                item = await anext(source, _END)
            elif watch.due:
                # Its end may have come with its last item: then it ends as it would have.
                item = _DRAINED if await _last_read(source) is not _END else _END
            else:
                item = await cut.next(source)
            if item is _DRAINED:
                last = _final(final_event)
                if last is not None:
                    yield last
                return
            if item is _END:
                return
            if resumable and watch is not None and not watch.at_start and isinstance(item, LoggedEvent):
                watch.end_at_start()
            number += 1
            yield _event(item, str(number) if ids else None)
    finally:
        try:
            if watch is not None:
                await watch.close()
        finally:
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()


def _final(final_event: FinalEvent) -> ServerSentEvent | None:
    """The event a stream ends with at a drain (a failing callable: none, logged)."""
    if not callable(final_event):
        return final_event
    try:
        return final_event()
    except Exception:
        logger.exception("Request %s: the stream's final_event failed", request_context.current_request_id())
        return None


_END = object()
_DRAINED = object()
#: At its drain's deadline, how long a stream's source gets to say it has ended anyway.
_LAST_READ_S = 0.05


async def _last_read(source: AsyncIterator[object]) -> object:
    """``_END`` if ``source`` ends at once (a stream that sent its last event just as the
    deadline came ends as it would have, with no final event after it), else ``_DRAINED``
    (an item it had ready is dropped: the stream is cut at this point)."""
    try:
        async with asyncio.timeout(_LAST_READ_S):
            item = await anext(source, _END)
    except TimeoutError:
        return _DRAINED
    return _END if item is _END else _DRAINED


class _Cut:
    """Ends a stream's wait for its next item when its drain watch says it must end.

    The watch cancels the task reading the stream if it is waiting for an item then (the
    source stops at its ``await``, as on a client leaving); a stream busy elsewhere sees
    ``watch.due`` before its next read. Racing each item against the drain instead cost
    two tasks per item, on every token of a chat reply.
    """

    __slots__ = ("_reader", "_reading", "_cut")

    def __init__(self) -> None:
        self._reader: asyncio.Task[object] | None = None  # the task waiting for an item
        self._reading = False
        self._cut = False  # the reader was cancelled for the drain

    async def now(self) -> None:
        """The stream must end: stop its wait for an item, if it is waiting."""
        if self._reading and self._reader is not None and not self._cut:
            self._cut = True
            self._reader.cancel()

    async def next(self, source: AsyncIterator[object]) -> object:
        """The source's next item, ``_END``, or ``_DRAINED``."""
        self._reader = asyncio.current_task()
        self._reading = True
        try:
            item = await anext(source, _END)
        except asyncio.CancelledError:
            # Ours alone (not also the client leaving): the drain ended the wait.
            if self._cut and self._reader is not None and self._reader.uncancel() == 0:
                return _DRAINED
            raise
        finally:
            self._reading = False
        if self._cut and self._reader is not None:  # the source swallowed the cancellation
            self._reader.uncancel()
            return _DRAINED
        return item


async def _as_async(events: AsyncIterable[T] | Iterable[T]) -> AsyncIterator[T]:
    if isinstance(events, AsyncIterable):
        async for item in events:
            yield item
    else:
        for item in events:
            yield item


def _event(item: object, number: str | None) -> ServerSentEvent:
    if isinstance(item, LoggedEvent):  # from an EventLog: its own id, what a client resumes after
        return ServerSentEvent(data=item.data, event=item.event or None, id=item.id)
    if isinstance(item, ServerSentEvent):
        if item.id is None and number is not None:
            item.id = number
        return item
    if isinstance(item, dict) and "data" in item:
        fields = dict(item)
        if number is not None:
            fields.setdefault("id", number)
        return ServerSentEvent(**fields)
    data = item if isinstance(item, str) else json.dumps(item)
    return ServerSentEvent(data=data, id=number)


@dataclass(frozen=True, slots=True)
class OpenAIErrorEvent:
    """An error that ends an OpenAI-compatible stream, as the last event of each API's
    stream: the official ``openai`` client (and LangChain, built on it) raises
    ``openai.APIError`` with ``message``; the AI SDK reports an ``error`` part and
    finish reason ``"error"``.

    ``OpenAIErrorEvent.restarting()`` is the one a stream ends with at its replica's
    drain deadline: ``final_event=lambda: OpenAIErrorEvent.restarting().chat_completions()``.
    """

    message: str
    code: str | None
    type: str = "server_error"
    param: str | None = None

    @classmethod
    def restarting(cls) -> OpenAIErrorEvent:
        """The server restarts (the stream's replica stopped): send the request again."""
        request_id = request_context.current_request_id()
        said = f" (request id {request_id})" if request_id else ""
        return cls(f"The server is restarting; retry the request{said}.", RESTART_CODE)

    def chat_completions(self) -> ServerSentEvent:
        """As a Chat Completions stream's last event (``data: {"error": {...}}``, with no
        ``[DONE]`` after it). Not a chunk: with ``choices`` the AI SDK would drop the error."""
        return ServerSentEvent(data=json.dumps({"error": self._error()}))

    def responses(self, sequence_number: int) -> ServerSentEvent:
        """As a Responses API stream's last event, numbered ``sequence_number`` (the next
        in the stream): OpenAI's ``error`` event, with the error nested in it too, for
        openai-python raises only for that (the AI SDK needs the ``sequence_number``)."""
        data = {
            "type": "error",
            "sequence_number": sequence_number,
            "code": self.code,
            "message": self.message,
            "param": self.param,
            "error": self._error(),
        }
        return ServerSentEvent(event="error", data=json.dumps(data))

    def _error(self) -> dict[str, str | None]:
        return {"message": self.message, "type": self.type, "code": self.code, "param": self.param}


class ChatCompletionStream(EventStream):
    """An OpenAI-compatible ``chat.completion.chunk`` stream from text pieces.

    Readable unchanged by OpenAI clients: a first chunk with the assistant role, one chunk
    per piece, a last chunk with ``finish_reason``, an optional usage chunk (the chunks
    before it then carry ``"usage": null``, as OpenAI's do), then ``data: [DONE]``. If
    ``pieces`` raises, the client gets an ``error`` chunk (a generic message with the
    request id; the traceback goes to the replica log) and no ``[DONE]``;
    if they raise ``ReplicaUnavailableError`` (the deployment streaming them restarted or
    was lost), or the stream is still open at its replica's drain deadline, the error
    says the server is restarting (:meth:`OpenAIErrorEvent.restarting`): retry.

    ``finish_reason`` and ``completion_tokens`` may be callables, asked once the pieces
    have ended (e.g. ``"length"`` when the model hit ``max_tokens``, or a token count
    that differs from the number of pieces).
    """

    def __init__(
        self,
        pieces: AsyncIterable[str] | Iterable[str],
        *,
        model: str,
        include_usage: bool = False,
        prompt_tokens: int = 0,
        finish_reason: str | Callable[[], str] = "stop",
        completion_tokens: Callable[[], int] | None = None,
        ping_s: float = 15.0,
    ) -> None:
        super().__init__(
            _chat_chunks(pieces, model, include_usage, prompt_tokens, finish_reason, completion_tokens),
            ping_s=ping_s,
            ids=False,
            final_event=_restart_chunk,
            end_at_drain=False,
        )


def _restart_chunk() -> ServerSentEvent:
    return OpenAIErrorEvent.restarting().chat_completions()


async def _chat_chunks(
    pieces: AsyncIterable[str] | Iterable[str],
    model: str,
    include_usage: bool,
    prompt_tokens: int,
    finish_reason: str | Callable[[], str],
    completion_tokens: Callable[[], int] | None,
) -> AsyncIterator[dict[str, str] | ServerSentEvent]:
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())

    def chunk(delta: dict[str, str], reason: str | None = None) -> dict[str, str]:
        body: dict[str, object] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}],
        }
        if include_usage:  # OpenAI: every chunk before the usage chunk has "usage": null
            body["usage"] = None
        return {"data": json.dumps(body)}

    yield chunk({"role": "assistant", "content": ""})
    count = 0
    try:
        async for piece in _as_async(pieces):
            count += 1
            yield chunk({"content": piece})
    except ReplicaUnavailableError as exc:  # where the pieces come from stopped (or was lost)
        logger.warning(
            "Request %s: the chat stream was cut off: %s", request_context.current_request_id(), exc
        )
        yield _restart_chunk()
        return
    except Exception:
        request_id = request_context.current_request_id()
        logger.exception("Request %s: the chat stream failed", request_id)
        yield OpenAIErrorEvent(
            f"Internal Server Error (request id {request_id})", "internal_error"
        ).chat_completions()
        return
    yield chunk({}, finish_reason if isinstance(finish_reason, str) else finish_reason())
    if include_usage:
        completed = count if completion_tokens is None else completion_tokens()
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completed,
            "total_tokens": prompt_tokens + completed,
        }
        yield {
            "data": json.dumps(
                {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
            )
        }
    yield {"data": "[DONE]"}
