"""The responses an ingress replica keeps (``store: true``, OpenAI's default), and the
events of those it streams, so that a client whose connection dropped resumes the
stream (``GET /v1/responses/{id}?stream=true&starting_after=N``) while the reply goes on.

A kept, streamed response is produced by a task this store owns, into an event log; the
client's own stream, and any resumed one, follow that log. :meth:`ResponseStore.close`
cancels and waits for the tasks still producing. Responses are kept in the replica that
made them, bounded in number and age; with several ingress replicas, a request naming
another replica's response finds none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable

from app_toolkit.event_log import LoggedEvent, MemoryEventLog, StreamAbandoned, UnknownStream
from app_toolkit.llm.errors import OpenAIError, bad_parameter
from app_toolkit.llm.openai.responses import Event, Reply
from app_toolkit.llm.openai_shapes import ChatMessage, TextMessage
from app_toolkit.llm.protocol import MAX_TOKENS
from app_toolkit.streaming import OpenAIErrorEvent

logger = logging.getLogger("app_toolkit.llm")

#: Responses kept per ingress replica; a new one beyond it replaces the oldest that ended.
MAX_KEPT_RESPONSES = 1_000
#: How long a response (and its events) is kept after it was made, in seconds.
KEEP_RESPONSES_S = 3_600.0
#: Kept responses being streamed at once per ingress replica; one more is a 503. Fewer than
#: :data:`MAX_KEPT_RESPONSES`, so there is always an ended one to make room.
MAX_PRODUCING = 256
#: A stream whose producer wrote nothing for this long is over for its readers (a model
#: waiting this long for an engine slot, or hung), in seconds.
PRODUCER_SILENCE_S = 600.0
#: Events a response's stream holds at most: one per output token, and those around them.
MAX_EVENTS = MAX_TOKENS + 16


def unknown_response(response_id: str, param: str | None = None) -> OpenAIError:
    """OpenAI's 404 for a response it does not have (``param``: the field that named it)."""
    return OpenAIError(
        404,
        f"Response with id {response_id!r} not found (store: false keeps none; this server keeps "
        f"responses for {KEEP_RESPONSES_S:.0f} s, at most {MAX_KEPT_RESPONSES}).",
        "invalid_request_error",
        None,
        param,
    )


def _overloaded(what: str) -> OpenAIError:
    return OpenAIError(503, f"{what} on this server; retry shortly.", "server_error", "overloaded")


class ResponseStore:
    """Kept responses (their input, output and usage), the event logs of those streamed,
    and the tasks producing them; ``clock`` is ``time.monotonic`` but in tests."""

    def __init__(
        self,
        *,
        max_kept: int = MAX_KEPT_RESPONSES,
        keep_s: float = KEEP_RESPONSES_S,
        max_producing: int = MAX_PRODUCING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 1 <= max_producing < max_kept:
            raise ValueError(f"max_producing must be >= 1 and < max_kept ({max_kept}), got {max_producing}")
        self._max_kept = max_kept
        self._keep_s = keep_s
        self._max_producing = max_producing
        self._clock = clock
        self._kept: OrderedDict[str, tuple[float, Reply]] = OrderedDict()  # oldest first
        self._log = MemoryEventLog(
            max_streams=max_kept, max_events=MAX_EVENTS, keep_s=keep_s, writer_timeout_s=PRODUCER_SILENCE_S
        )
        self._producing: dict[asyncio.Task[None], Reply] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, reply: Reply) -> None:
        """Keep ``reply``; the oldest past their age, then the oldest that ended, make room."""
        now = self._clock()
        for response_id, (kept_at, _) in list(self._kept.items()):
            if now - kept_at <= self._keep_s:
                break
            del self._kept[response_id]
        if len(self._kept) >= self._max_kept:
            ended = next((rid for rid, (_, kept) in self._kept.items() if kept.done), None)
            if ended is None:
                raise _overloaded("Too many responses in progress")
            del self._kept[ended]
        self._kept[reply.id] = (now, reply)

    def get(self, response_id: str) -> Reply:
        """The kept response; 404 if there is none (never kept, deleted, or too old)."""
        found = self._kept.get(response_id)
        if found is None or self._clock() - found[0] > self._keep_s:
            self._kept.pop(response_id, None)
            raise unknown_response(response_id)
        return found[1]

    def delete(self, response_id: str) -> None:
        """Forget the response (one still streaming goes on for its readers)."""
        self.get(response_id)
        del self._kept[response_id]

    def conversation(self, previous_response_id: str | None) -> tuple[ChatMessage, ...]:
        """What ``previous_response_id`` continues: its conversation and its reply."""
        if previous_response_id is None:
            return ()
        try:
            previous = self.get(previous_response_id)
        except OpenAIError:
            raise unknown_response(previous_response_id, "previous_response_id") from None
        if not previous.done:
            raise bad_parameter(
                "previous_response_id",
                f"Response {previous_response_id!r} is still in progress; continue it once it has ended.",
            )
        return previous.continued()

    def referenced(self, item_id: str, param: str) -> TextMessage | None:
        """The kept, ended reply whose output message is ``item_id``, as a chat message;
        None where ``item_id`` is its reasoning (left out of the prompt, as vLLM leaves a
        response's reasoning out of the next turn)."""
        now = self._clock()
        for kept_at, reply in self._kept.values():
            if reply.done and now - kept_at <= self._keep_s:
                if reply.message_id == item_id:
                    return {"role": "assistant", "content": "".join(reply.text)}
                if reply.reasoning_id == item_id and reply.reasoning:
                    return None
        raise OpenAIError(
            404,
            f"Item with id {item_id!r} not found: this server keeps the output messages of ended, "
            "kept responses only (send the message itself instead).",
            "invalid_request_error",
            None,
            param,
        )

    async def produce(self, reply: Reply, events: AsyncIterator[Event]) -> Followed:
        """Keep ``reply`` and write its ``events`` into its log from a task of this store's,
        which goes on if the client leaves; the client's stream follows the log."""
        if len(self._producing) >= self._max_producing:
            raise _overloaded("Too many responses streaming")
        self.keep(reply)
        try:
            kind, data = await anext(events)  # the log has the stream before anyone follows it
            await self._log.append(reply.id, data, kind)
        except BaseException:
            await _closed(events)
            raise
        task = asyncio.get_running_loop().create_task(self._write(reply, events))
        self._producing[task] = reply
        task.add_done_callback(self._producing.pop)
        return await self.follow(reply.id, None)

    async def _write(self, reply: Reply, events: AsyncIterator[Event]) -> None:
        try:
            async for kind, data in events:
                await self._log.append(reply.id, data, kind)
        except asyncio.CancelledError:
            await self._interrupt(reply)
            raise
        except Exception:
            logger.exception("Response %s: its events could not be kept", reply.id)
            reply.fail("The response's events could not be kept.")  # its place may go to another
        finally:
            await _closed(events)  # the model's stream is let go now
            with contextlib.suppress(UnknownStream):  # dropped after a silence: nothing to close
                await self._log.close(reply.id)

    async def follow(self, response_id: str, starting_after: int | None) -> Followed:
        """The response's events after ``starting_after`` (a ``sequence_number``; None: all),
        as they come, until it ends. 404 for a response not kept; 400 for one not streamed,
        or a number the stream has not reached."""
        self.get(response_id)
        after = "" if starting_after is None else str(starting_after + 1)  # log ids count from 1
        try:
            following: AsyncIterator[LoggedEvent] = await self._log.follow(response_id, after)
        except StreamAbandoned as abandoned:  # the reader has it all: its stream says so at once
            following = _raising(abandoned)
        except UnknownStream:
            raise bad_parameter(
                "stream",
                f"Response {response_id!r} was not streamed, so it has no events to stream; "
                "retrieve it without stream=true.",
            ) from None
        except ValueError:
            raise bad_parameter(
                "starting_after",
                f"Response {response_id!r} has no event after sequence_number {starting_after} yet.",
            ) from None
        return Followed(response_id, following, -1 if starting_after is None else starting_after)

    async def _interrupt(self, reply: Reply) -> None:
        """End a response cut off by the ingress replica stopping: its readers hear retry."""
        if reply.done:
            return
        kind, data = reply.error_event(OpenAIErrorEvent.restarting())
        with contextlib.suppress(ValueError, UnknownStream):  # closed already (its writer failed), or dropped
            await self._log.append(reply.id, data, kind)
            await self._log.close(reply.id)

    async def close(self) -> None:
        """Stop the responses still being produced (the ingress replica stops), and wait."""
        producing = dict(self._producing)
        for task in producing:
            task.cancel()
        await asyncio.gather(*producing, return_exceptions=True)
        for reply in producing.values():  # a task cancelled before it started ran no code
            await self._interrupt(reply)


class Followed:
    """A reader's events of one kept response, and the ``sequence_number`` an event that
    ends its stream early takes (:meth:`next_number`)."""

    def __init__(self, response_id: str, following: AsyncIterator[LoggedEvent], last: int) -> None:
        self._response_id = response_id
        self._following = following
        self._last = last
        self.events = self._events()

    def next_number(self) -> int:
        return self._last + 1

    async def _events(self) -> AsyncIterator[Event]:
        try:
            async for logged in self._following:
                self._last = int(logged.id) - 1
                yield Event(logged.event, logged.data)
        except StreamAbandoned:
            logger.warning("Response %s: its producer went silent", self._response_id)
            sent = OpenAIErrorEvent(
                "The response stopped being produced; send the request again.", "server_error"
            ).responses(self.next_number())
            yield Event(str(sent.event), str(sent.data))
        finally:
            await _closed(self._following)


async def _raising(error: Exception) -> AsyncIterator[LoggedEvent]:
    """Events that are none but ``error``, raised when the first is asked for."""
    raise error
    yield  # an async generator: the raise waits for the reader


async def _closed(events: AsyncIterator[object]) -> None:
    """Close an async generator (its ``finally`` runs now, not when it is collected)."""
    close = getattr(events, "aclose", None)
    if close is not None:
        await close()
