"""Resumable replies for the page: generation runs apart from the connection that reads it.

The page starts a reply (``start``), then reads its events (``events``) over SSE. Each
event has a number; a reader that lost its connection asks again from the last number it
saw and gets the rest, without repeats. A reply keeps all its events until it ends (a
reply is at most ``max_tokens`` pieces), and stays readable for ``reply_keep_s`` after
that. ``stop`` ends the generation on the model; a reply nobody reads for
``reply_orphan_s`` is stopped too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import app_toolkit as tk

from .schemas import ChatError, Delta, Generation
from .settings import Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplyEvent:
    """One numbered event of a reply: ``token`` (text), ``done`` or ``failed``."""

    number: int
    kind: str
    data: dict[str, Any]


@dataclass(eq=False)
class _Reply:
    events: list[ReplyEvent] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    task: asyncio.Task[None] | None = None
    ended_at: float | None = None
    readers: int = 0
    unread_since: float = field(default_factory=time.monotonic)

    def has_news(self, sent: int) -> bool:
        """Whether a reader that has ``sent`` events has more to send, or is done."""
        return len(self.events) > sent or self.ended_at is not None


@tk.deployment(num_replicas=1, max_ongoing_requests=1000)
class Replies:
    """Holds the replies in flight and the recently finished ones, bounded in number."""

    def __init__(self, model: tk.DeploymentHandle, settings: Settings) -> None:
        self._model = model.options(method_name="generate", stream=True)
        self._settings = settings
        self._replies: dict[str, _Reply] = {}
        self._admitting = 0
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, generation: Generation) -> str:
        """Admit a reply and start generating it; its id names it to ``events`` and ``stop``.

        Raises :class:`ChatError` (503 when full, or what the model refused with).
        """
        self._sweep(time.monotonic())
        if len(self._replies) + self._admitting >= self._settings.max_replies:
            raise ChatError(503, "Too many replies in progress; retry shortly.", "server_error", "overloaded")
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())
        self._admitting += 1  # holds its place while the model looks at the prompt
        try:
            stream = self._model.remote(generation)
            first: Delta = await anext(stream)  # raises what the model refused the request with
        finally:
            self._admitting -= 1
        reply_id = uuid.uuid4().hex
        reply = _Reply()
        self._replies[reply_id] = reply
        reply.task = asyncio.get_running_loop().create_task(self._pump(reply, stream, first))
        return reply_id

    async def _pump(self, reply: _Reply, stream: Any, first: Delta) -> None:
        try:
            async for delta in stream:
                if delta.finish_reason is None:
                    await self._append(reply, "token", {"text": delta.text})
                    continue
                usage = {"prompt_tokens": first.prompt_tokens, "completion_tokens": delta.completion_tokens}
                await self._append(reply, "done", {"finish_reason": delta.finish_reason, "usage": usage})
        except asyncio.CancelledError:
            stream.cancel()  # the model stops generating and frees the reply's batch slot
            await self._append(reply, "done", {"finish_reason": "stopped"})
        except Exception:
            logger.exception("A reply failed")
        finally:
            if reply.ended_at is None:
                await self._append(reply, "failed", {"message": "The model failed; try again."})

    async def _append(self, reply: _Reply, kind: str, data: dict[str, Any]) -> None:
        async with reply.changed:
            reply.events.append(ReplyEvent(len(reply.events) + 1, kind, data))
            if kind != "token":
                reply.ended_at = time.monotonic()
            reply.changed.notify_all()

    async def events(self, reply_id: str, after: int = 0) -> AsyncIterator[ReplyEvent]:
        """The reply's events numbered above ``after``, as they come, until it ends."""
        reply = self._replies.get(reply_id)
        if reply is None:
            raise ChatError(
                404,
                f"No reply {reply_id!r} (finished replies are kept for a while only).",
                "invalid_request_error",
                "reply_not_found",
            )
        reply.readers += 1
        try:
            sent = max(0, after)
            while True:
                async with reply.changed:
                    await reply.changed.wait_for(functools.partial(reply.has_news, sent))
                    fresh = reply.events[sent:]
                for event in fresh:
                    yield event
                sent += len(fresh)
                if reply.ended_at is not None and sent >= len(reply.events):
                    return
        finally:
            reply.readers -= 1
            reply.unread_since = time.monotonic()

    async def stop(self, reply_id: str) -> bool:
        """Stop generating ``reply_id``; False if there is no such reply."""
        reply = self._replies.get(reply_id)
        if reply is None:
            return False
        if reply.task is not None and not reply.task.done():
            reply.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reply.task
        return True

    def _sweep(self, now: float) -> None:
        for reply_id, reply in list(self._replies.items()):
            if reply.ended_at is not None and now - reply.ended_at > self._settings.reply_keep_s:
                del self._replies[reply_id]
            elif reply.readers == 0 and reply.task is not None and not reply.task.done():
                if now - reply.unread_since > self._settings.reply_orphan_s:
                    reply.task.cancel()  # nobody came back for it: free the model

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self._sweep(time.monotonic())
