"""Resumable replies for the page: generation runs apart from the connection that reads it.

The page starts a reply (``start``), then reads its events (``events``) over SSE. Each
event has an id; a reader that lost its connection asks again from the last id it saw
and gets the rest, without repeats. The events go to an event log
(``settings.reply_store``): in this process (``memory``), or in Redis, where every
replica reads them and they outlive the replica that wrote them. A reply's calls go to
one replica (the reply id is their shard key), the one that generates it: ``stop`` ends
the generation on the model there; a reply nobody reads for ``reply_orphan_s`` is
stopped too. Closing a reply's stream is what stops it, so a ``stop`` that reaches
another replica (its own died, or the replicas changed) still ends the reply. A reply
whose writer was lost (its replica died; Redis store) is taken over by the replica that
next serves one of its readers: it continues the reply on the model from the prompt and
the text stored so far (kept with the reply's ``started`` event).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import app_toolkit as tk
from app_toolkit.llm import Delta, OpenAIError

from . import metrics
from .schemas import Generation
from .settings import Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplyEvent:
    """One event of a reply: ``token`` (text), ``done`` or ``failed``; ``data`` is JSON."""

    id: str
    kind: str
    data: str


@dataclass(eq=False)
class _Pump:
    """A reply this replica generates."""

    task: asyncio.Task[None] | None = None
    readers: int = 0
    unread_since: float = field(default_factory=time.monotonic)
    #: Its name as the reply's writer: once another replica took the reply over, the
    #: store refuses this pump's writes (one that hung and woke up writes nothing).
    writer: str = field(default_factory=lambda: uuid.uuid4().hex)


def make_log(settings: Settings) -> tk.EventLog:
    """The event log ``settings`` choose for the replies."""
    bounds: dict[str, Any] = {
        "max_events": settings.max_context_tokens + 8,  # a reply's tokens, and its last event
        "keep_s": settings.reply_keep_s,
        "writer_timeout_s": settings.reply_writer_timeout_s,
    }
    if settings.reply_store == "redis":
        url = settings.redis_url.get_secret_value()
        return tk.RedisEventLog(url, prefix="chat:replies:", **bounds)
    return tk.MemoryEventLog(max_streams=4 * settings.max_replies, **bounds)


_MAX_BATCH = 256  # pieces stored in one append at most
_MAX_TAKEOVERS = 3  # a reader's attempts to take over (or wait for) a reply whose writer is lost
_CLOSED = "closed elsewhere"  # the finish reason _relay gives a reply another replica stopped


async def _read_into(stream: Any, came: asyncio.Queue[Delta | Exception]) -> None:
    """The model's deltas, then what ended them (an error, or its stream ending unsaid)."""
    try:
        async for delta in stream:
            await came.put(delta)
            if delta.finish_reason is not None:
                return
        await came.put(RuntimeError("the model's stream ended without saying why"))
    except Exception as failed:  # e.g. ReplicaUnavailableError: the pump continues the reply elsewhere
        await came.put(failed)


def _overloaded(what: str) -> OpenAIError:
    return OpenAIError(503, f"{what}; retry shortly.", "server_error", "overloaded")


@tk.deployment(max_ongoing_requests=1000)
class Replies:
    """Generates replies into the event log, bounded in number per replica."""

    def __init__(self, model: tk.DeploymentHandle, settings: Settings) -> None:
        self._model = model.options(method_name="generate", stream=True)
        self._settings = settings
        self._log = make_log(settings)
        self._pumps: dict[str, _Pump] = {}
        self._admitting = 0
        self._sweeper: asyncio.Task[None] | None = None
        self._handing_over = False  # this replica is stopping: its pumps let go of their replies

    async def __del__(self) -> None:
        """This replica stops (the toolkit awaits this, as Ray Serve does): the replies it
        still generates are let go of unfinished, so that with Redis the replica serving
        one of their readers takes each over at once instead of after
        ``reply_writer_timeout_s``. (In memory they go with this process.)"""
        self._handing_over = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        running = {reply_id: pump for reply_id, pump in self._pumps.items() if pump.task is not None}
        for pump in running.values():
            assert pump.task is not None
            pump.task.cancel()
        # Let go first, then wait for the pumps: a pump still stopping (a loaded machine)
        # cannot write after a taker took its reply (the store refuses its writer name).
        await asyncio.gather(
            *(self._log.release(reply_id, writer=pump.writer) for reply_id, pump in running.items()),
            return_exceptions=True,
        )
        await asyncio.gather(*(pump.task for pump in running.values() if pump.task), return_exceptions=True)
        if running:
            logger.info("Let go of %d unfinished replies for other replicas to take over", len(running))

    async def start(self, reply_id: str, generation: Generation) -> None:
        """Admit reply ``reply_id`` (a new uuid) and start generating it.

        Raises :class:`OpenAIError` (503 when full, or what the model refused with).
        """
        if len(self._pumps) + self._admitting >= self._settings.max_replies:
            raise _overloaded("Too many replies in progress")
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())
        self._admitting += 1  # holds its place while the model looks at the prompt
        pump = _Pump()
        try:
            stream = self._model.remote(generation)
            first: Delta = await anext(stream)  # raises what the model refused the request with
            started = {"generation": generation.to_json(), "prompt_tokens": first.prompt_tokens}
            try:  # readable once this returns; what another replica needs to take the reply over
                await self._log.append(reply_id, json.dumps(started), "started", writer=pump.writer)
            except OverflowError:
                stream.cancel()
                raise _overloaded("Too many replies kept") from None
            except BaseException:
                stream.cancel()
                raise
        finally:
            self._admitting -= 1
        self._start_pump(pump, reply_id, generation, first.prompt_tokens, stream, [])

    def _start_pump(
        self,
        pump: _Pump,
        reply_id: str,
        generation: Generation,
        prompt_tokens: int,
        stream: Any,
        pieces: list[str],
    ) -> _Pump:
        self._pumps[reply_id] = pump
        pump.task = asyncio.get_running_loop().create_task(
            self._pump(reply_id, pump.writer, generation, prompt_tokens, stream, pieces)
        )
        return pump

    async def _pump(
        self,
        reply_id: str,
        writer: str,
        generation: Generation,
        prompt_tokens: int,
        stream: Any,
        pieces: list[str],
    ) -> None:
        """Generate the reply into its stream. ``pieces`` is the reply so far (what a lost
        writer stored, for a reply taken over), and ``stream`` the model's stream, or None
        to continue from ``pieces`` on a model replica."""
        ended = False
        failure = "The model failed; try again."
        this = asyncio.current_task()
        assert this is not None
        alive = asyncio.get_running_loop().create_task(self._keep_alive(reply_id, writer, this))
        earlier = len(pieces)  # tokens produced before the current model stream, one a piece
        attempts = self._settings.reply_continue_attempts
        last: Delta | None = None
        try:
            if stream is None:
                stream = await self._continue(reply_id, generation, "".join(pieces), earlier)
            while last is None:
                if stream is None:  # nothing is left to produce
                    last = Delta(finish_reason="length")
                    break
                try:
                    last = await self._relay(reply_id, writer, stream, pieces)
                except tk.ReplicaUnavailableError:
                    if attempts == 0:
                        raise
                    attempts -= 1
                    earlier = len(pieces)
                    metrics.RESUMED.inc("model")
                    stream = await self._continue(reply_id, generation, "".join(pieces), earlier)
            if last.finish_reason == _CLOSED:
                ended = True  # a stop that reached another replica ended it
            else:
                produced = earlier + last.completion_tokens
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": produced}
                ended = await self._end(
                    reply_id, "done", {"finish_reason": last.finish_reason, "usage": usage}, writer
                )
        except asyncio.CancelledError:
            if stream is not None:
                stream.cancel()  # the model stops generating and frees the reply's batch slot
            if self._handing_over:
                ended = True  # not ended: another replica goes on with it (__del__)
                return
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(pieces)}
            ended = await self._end(reply_id, "done", {"finish_reason": "stopped", "usage": usage}, writer)
        except OpenAIError as refused:  # e.g. an upstream that cannot continue a reply
            logger.warning("Reply %s failed: %s", reply_id, refused.message)
            failure = refused.message
        except Exception:
            logger.exception("Reply %s failed", reply_id)
        finally:
            alive.cancel()
            self._pumps.pop(reply_id, None)
            if not ended:
                await self._end(reply_id, "failed", {"message": failure}, writer)

    async def _relay(self, reply_id: str, writer: str, stream: Any, pieces: list[str]) -> Delta:
        """Store the model's pieces as they come; returns its last delta (why it ended).

        The model's stream is read apart from the writing: the pieces that came while one
        append was on its way to the store go in the next one together (with Redis, a
        round trip for every piece would cap a replica at a few thousand a second).
        """
        came: asyncio.Queue[Delta | Exception] = asyncio.Queue(_MAX_BATCH)  # bounded: the model waits
        reader = asyncio.get_running_loop().create_task(_read_into(stream, came))
        try:
            while True:
                batch = [await came.get()]
                while not came.empty() and len(batch) < _MAX_BATCH:
                    batch.append(came.get_nowait())
                texts: list[str] = []
                end: Delta | Exception | None = None
                for item in batch:
                    if isinstance(item, Exception) or item.finish_reason is not None:
                        end = item
                        break
                    texts.append(item.text)
                if texts:
                    events = [(json.dumps({"text": text}), "token") for text in texts]
                    try:
                        await self._log.append_many(reply_id, events, writer=writer)
                    except (ValueError, tk.UnknownStream):  # closed by a stop elsewhere, taken
                        stream.cancel()  # over (WriterReplaced), or lost with the store (Redis)
                        return Delta(finish_reason=_CLOSED)
                    pieces.extend(texts)
                if isinstance(end, Exception):
                    raise end
                if end is not None:
                    return end
        finally:
            reader.cancel()

    async def _continue(self, reply_id: str, generation: Generation, prefix: str, produced: int) -> Any:
        """The rest of a reply whose model replica was lost, from another replica (None:
        nothing is left to produce)."""
        left = generation.max_tokens - produced
        if left <= 0:
            return None
        logger.warning(
            "Reply %s: continued on a model replica after %d tokens (its model or writer was lost)",
            reply_id,
            produced,
        )
        stream = self._model.remote(dataclasses.replace(generation, prefix=prefix, max_tokens=left))
        await anext(stream)  # the prompt count (or the refusal, raised)
        return stream

    async def _keep_alive(self, reply_id: str, writer: str, pump: asyncio.Task[None]) -> None:
        """Tell readers the reply is being generated while no token comes (a long prompt
        read, a full batch), so they do not take it for lost. A pump that was replaced
        (another replica took the reply over while this one hung) is stopped."""
        while True:
            await asyncio.sleep(self._settings.reply_writer_timeout_s / 3)
            try:
                await self._log.touch(reply_id, writer=writer)
            except tk.WriterReplaced:
                logger.warning("Reply %s: taken over by another replica; this one stops it", reply_id)
                pump.cancel()  # its writes are refused: it ends without writing
                return
            except Exception:  # noqa: BLE001 - the store may come back; the next touch tries
                logger.debug("Reply %s: keep-alive failed", reply_id, exc_info=True)

    async def _end(self, reply_id: str, kind: str, data: dict[str, Any], writer: str = "") -> bool:
        """Write the reply's last event and close it (False: another replica closed it, or
        took it over from ``writer``). A stop that names no writer ends it wherever it runs."""
        try:
            await self._log.append(reply_id, json.dumps(data), kind, writer=writer)
            await self._log.close(reply_id, writer=writer)
        except (ValueError, tk.UnknownStream):
            return False
        except Exception:
            logger.exception("Reply %s: its end could not be stored", reply_id)
            return False
        return True

    async def events(self, reply_id: str, after: str = "") -> AsyncIterator[ReplyEvent]:
        """The reply's events after the one with id ``after``, as they come, until it ends.

        A reply whose writer was lost (its replica died: the store is Redis) is taken over
        here: this replica continues it from what was stored, and the reader goes on.
        """
        pump = self._pumps.get(reply_id)
        if pump is not None:
            pump.readers += 1
        takeovers = 0
        try:
            while True:
                try:
                    async for event in await self._open(reply_id, after):
                        after = event.id
                        if event.event != "started":
                            yield ReplyEvent(event.id, event.event, event.data)
                    return
                except tk.StreamAbandoned:  # on opening (read to its end) or while reading
                    if self._handing_over:
                        return  # this replica stops: its reader resumes on another, which takes over
                    if takeovers == _MAX_TAKEOVERS:
                        message = "The reply was lost with the process generating it; try again."
                        yield ReplyEvent("", "failed", json.dumps({"message": message}))
                        return
                    takeovers += 1
                    taken = await self._take_over(reply_id)  # or another reader's replica did
                    if taken is not None and pump is None:
                        pump = taken
                        pump.readers += 1
        finally:
            if pump is not None:
                pump.readers -= 1
                pump.unread_since = time.monotonic()

    async def _open(self, reply_id: str, after: str) -> AsyncIterator[tk.LoggedEvent]:
        try:
            return await self._log.follow(reply_id, after)
        except tk.UnknownStream:
            raise OpenAIError(
                404,
                f"No reply {reply_id!r} (finished replies are kept for a while only).",
                "invalid_request_error",
                "reply_not_found",
            ) from None
        except ValueError as bad:
            raise OpenAIError(400, str(bad), "invalid_request_error", "invalid_event_id") from None

    async def _take_over(self, reply_id: str) -> _Pump | None:
        """Become the writer of a reply whose writer was lost, and go on generating it from
        what it stored (None: another replica took it, or it ended meanwhile)."""
        pump = _Pump()
        try:
            if not await self._log.take_over(reply_id, writer=pump.writer):
                return None
            stored = await self._log.read(reply_id)
        except tk.UnknownStream:
            return None
        started: dict[str, Any] = next((json.loads(e.data) for e in stored if e.event == "started"), {})
        if "generation" not in started:  # written by an older version: cannot be continued
            await self._end(reply_id, "failed", {"message": "The reply was lost; try again."}, pump.writer)
            return None
        pieces = [json.loads(e.data)["text"] for e in stored if e.event == "token"]
        logger.warning(
            "Reply %s: its writer was lost after %d tokens; this replica takes it over", reply_id, len(pieces)
        )
        generation = Generation.from_json(started["generation"])
        metrics.RESUMED.inc("writer")
        return self._start_pump(pump, reply_id, generation, started["prompt_tokens"], None, pieces)

    async def stop(self, reply_id: str) -> bool:
        """Stop generating ``reply_id``; False if there is no such reply."""
        pump = self._pumps.get(reply_id)
        if pump is not None and pump.task is not None and not pump.task.done():
            pump.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump.task
            return True
        try:  # generated elsewhere (or done): closing its stream stops it there
            await self._log.touch(reply_id)
        except tk.UnknownStream:
            return False
        await self._end(reply_id, "done", {"finish_reason": "stopped"})
        return True

    def _sweep(self, now: float) -> None:
        for pump in self._pumps.values():
            if pump.readers == 0 and pump.task is not None and not pump.task.done():
                if now - pump.unread_since > self._settings.reply_orphan_s:
                    pump.task.cancel()  # nobody came back for it: free the model

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self._sweep(time.monotonic())
