"""Server-sent events done right by default, and OpenAI-compatible chat streams.

:class:`EventStream` wraps sse-starlette's ``EventSourceResponse``: ``Cache-Control:
no-cache``, ``X-Accel-Buffering: no`` (so proxies do not buffer), a comment heartbeat every
15 s, numbered event ids, and a final ``drain`` event when the replica starts shutting
down, so clients reconnect elsewhere at once instead of waiting on a stream that ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from typing import Literal, TypeVar

from sse_starlette import EventSourceResponse, ServerSentEvent

from app_toolkit._runtime import request_context
from app_toolkit.event_log import LoggedEvent

T = TypeVar("T")
logger = logging.getLogger("app_toolkit.streaming")

DRAIN_EVENT = ServerSentEvent(event="drain", data="server is shutting down; reconnect", retry=1000)


class EventStream(EventSourceResponse):
    """An SSE response from an (async) iterable of events.

    Items may be strings (sent as ``data``), dicts of SSE fields (``data``, ``event``,
    ``id``, ``retry``), ``ServerSentEvent`` objects, an :class:`~app_toolkit.EventLog`'s
    events (with their ids: ``EventStream(await log.follow(stream, after=last_event_id))``),
    or any JSON-able value (sent as JSON).
    Events without an id get the next number (``ids=False`` turns that off).
    """

    def __init__(
        self,
        events: AsyncIterable[object] | Iterable[object],
        *,
        ping_s: float = 15.0,
        ids: bool = True,
        final_event: ServerSentEvent | None = DRAIN_EVENT,
        headers: Mapping[str, str] | None = None,
        status_code: int = 200,
    ) -> None:
        super().__init__(
            _events(events, ids, final_event),
            status_code=status_code,
            headers={"Cache-Control": "no-cache", **(headers or {})},
            ping=ping_s,
        )


async def _events(
    events: AsyncIterable[object] | Iterable[object], ids: bool, final_event: ServerSentEvent | None
) -> AsyncIterator[ServerSentEvent]:
    source = _as_async(events)
    draining: asyncio.Event | None = request_context.draining.get()
    watch = _DrainWatch(draining) if draining is not None else None
    number = 0
    try:
        while True:
            if watch is None:
                item = await anext(source, _END)
            elif watch.draining.is_set():
                item = _DRAINED
            else:
                item = await watch.next(source)
            if item is _DRAINED:
                if final_event is not None:
                    yield final_event
                return
            if item is _END:
                return
            number += 1
            yield _event(item, str(number) if ids else None)
    finally:
        if watch is not None:
            watch.close()
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()


_END = object()
_DRAINED = object()


class _DrainWatch:
    """Ends a stream's wait for its next item when the replica starts draining.

    One waiter per stream cancels the task reading the stream if it is waiting for an
    item then (the source stops at its ``await``, as on a client leaving); a stream busy
    elsewhere sees the drain before its next read. Racing each item against the drain
    instead cost two tasks per item, on every token of a chat reply.
    """

    def __init__(self, draining: asyncio.Event) -> None:
        self.draining = draining
        self._reader: asyncio.Task[object] | None = None  # the task waiting for an item
        self._reading = False
        self._cut = False  # the reader was cancelled for the drain
        self._waiter = asyncio.ensure_future(draining.wait())
        self._waiter.add_done_callback(self._drained)

    def _drained(self, waiter: asyncio.Future[Literal[True]]) -> None:
        if waiter.cancelled():  # the stream ended first (close())
            return
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

    def close(self) -> None:
        self._waiter.cancel()


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


class ChatCompletionStream(EventStream):
    """An OpenAI-compatible ``chat.completion.chunk`` stream from text pieces.

    Readable unchanged by OpenAI clients: a first chunk with the assistant role, one chunk
    per piece, a last chunk with ``finish_reason``, an optional usage chunk, then
    ``data: [DONE]``. If ``pieces`` raises, the client gets an ``error`` chunk (a generic
    message with the request id; the traceback goes to the replica log) and no ``[DONE]``.

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
        )


async def _chat_chunks(
    pieces: AsyncIterable[str] | Iterable[str],
    model: str,
    include_usage: bool,
    prompt_tokens: int,
    finish_reason: str | Callable[[], str],
    completion_tokens: Callable[[], int] | None,
) -> AsyncIterator[dict[str, str]]:
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())

    def chunk(delta: dict[str, str], reason: str | None = None) -> dict[str, str]:
        body = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
        }
        return {"data": json.dumps(body)}

    yield chunk({"role": "assistant", "content": ""})
    count = 0
    try:
        async for piece in _as_async(pieces):
            count += 1
            yield chunk({"content": piece})
    except Exception:
        request_id = request_context.request_id.get()
        logger.exception("Request %s: the chat stream failed", request_id)
        error = {
            "message": f"Internal Server Error (request id {request_id})",
            "type": "server_error",
            "code": "internal_error",
        }
        yield {"data": json.dumps({"error": error})}
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
