"""Event logs: streams of server-sent events that outlive the connection reading them.

A writer appends events to a named stream; any number of readers read it from the start
or from the id of the last event they saw (an SSE client's ``Last-Event-ID``), as the
events come, until the writer closes it. A reader that lost its connection comes back
and gets the rest, without repeats. :class:`MemoryEventLog` keeps the streams in this
process; :class:`~app_toolkit.event_log_redis.RedisEventLog` keeps them in Redis Streams,
where every replica (and the next process, if this one dies) reads the same streams.

Every stream is bounded: it keeps its newest ``max_events`` events, is dropped
``keep_s`` after it is closed, and counts as abandoned once its writer has written
nothing for ``writer_timeout_s`` (readers then get :class:`StreamAbandoned` instead of
waiting for events that will never come).

A writer may name itself (``writer=``, any string unique to it, e.g. a uuid per attempt):
once another writer has taken the stream over, the writes of the one replaced (a process
that hung past ``writer_timeout_s`` and woke up) raise :class:`WriterReplaced` instead of
landing next to its successor's. Writes that name no writer are never refused this way.

A stream this log has written is never made again by a later append: if it is gone
meanwhile (Redis restarted without persistence, or it was dropped after a silence of
``writer_timeout_s + keep_s``), the append raises :class:`UnknownStream`, as its readers
get, instead of starting it again from an id its readers never saw.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """One event of a stream: its ``id`` (what a reader resumes after), its SSE
    ``event`` name ("" for a plain message) and its ``data``."""

    id: str
    event: str
    data: str


class UnknownStream(LookupError):
    """No stream has this name (never written, dropped after its ``keep_s``, or lost
    with the store that kept it)."""


class StreamAbandoned(RuntimeError):
    """The stream's writer stopped writing without closing it (its process died, or it
    hung) for longer than ``writer_timeout_s``."""


class WriterReplaced(ValueError):
    """Another writer took the stream over: the writer named in this call writes it no
    more (it should stop, leaving the stream to its successor)."""


class EventLog(ABC):
    """Where streams of events are kept; see the module's description."""

    def __init__(self, *, max_events: int, keep_s: float, writer_timeout_s: float) -> None:
        if max_events < 1:
            raise ValueError(f"max_events must be at least 1, got {max_events}")
        if keep_s <= 0 or writer_timeout_s <= 0:
            raise ValueError(
                f"keep_s and writer_timeout_s must be positive, got {keep_s}, {writer_timeout_s}"
            )
        self.max_events = max_events
        self.keep_s = keep_s
        self.writer_timeout_s = writer_timeout_s

    @abstractmethod
    async def append(self, stream: str, data: str, event: str = "", *, writer: str = "") -> str:
        """Add an event to ``stream`` (made on first use); returns the event's id.
        Raises ``ValueError`` if the stream was closed, :class:`WriterReplaced` (a
        ``ValueError``) if ``writer`` was replaced by a take-over (the first ``writer``
        named on a stream is its writer), :class:`UnknownStream` if this log wrote the
        stream before and it is gone (the writer should stop: its readers lost it too)."""

    async def append_many(
        self, stream: str, events: Sequence[tuple[str, str]], *, writer: str = ""
    ) -> list[str]:
        """Add several ``(data, event)`` events to ``stream`` at once, in order; returns
        their ids. A writer that produces faster than one append's round trip (Redis)
        appends what piled up meanwhile in one call."""
        return [await self.append(stream, data, event, writer=writer) for data, event in events]

    @abstractmethod
    async def touch(self, stream: str, *, writer: str = "") -> None:
        """Tell readers the writer is alive though it has nothing to append yet (a model
        still reading a long prompt): call it more often than ``writer_timeout_s``.
        Raises :class:`WriterReplaced` if ``writer`` was replaced."""

    @abstractmethod
    async def close(self, stream: str, *, writer: str = "") -> None:
        """No more events: readers end after the last one; the stream is kept ``keep_s``.
        Raises :class:`WriterReplaced` if ``writer`` was replaced."""

    @abstractmethod
    async def take_over(self, stream: str, *, writer: str = "") -> bool:
        """Become the writer of ``stream`` if its writer is gone (silent for longer than
        ``writer_timeout_s``, the stream not closed). Of several callers, at most one gets
        True; it then writes as the writer did (and should :meth:`touch` or append within
        ``writer_timeout_s``), and readers that follow again wait for its events. From
        then on the writer it replaced is refused (:class:`WriterReplaced`) and ``writer``
        (if named) is the stream's writer. Raises :class:`UnknownStream`."""

    @abstractmethod
    async def release(self, stream: str, *, writer: str = "") -> None:
        """The writer lets go of ``stream`` without closing it (its process is stopping):
        readers find it abandoned at once instead of after ``writer_timeout_s``, and one
        of them can :meth:`take_over` and go on. Does nothing to a closed stream, nor
        when ``writer`` was replaced already; raises :class:`UnknownStream`."""

    @abstractmethod
    async def read(self, stream: str) -> list[LoggedEvent]:
        """The events ``stream`` holds now (a taker-over reads what its writer had done).
        Raises :class:`UnknownStream`."""

    async def follow(self, stream: str, after: str = "") -> Following:
        """The events of ``stream`` after the one with id ``after`` ("" for all), as they
        come, until it is closed. Checked before it returns (so a route can still answer
        404, 400 or 410): raises :class:`UnknownStream`, ``ValueError`` for an id the
        stream has not given, and :class:`StreamAbandoned` when its writer is gone and the
        reader has every event it holds. While following, raises :class:`StreamAbandoned`
        once the reader has the events there are and the writer is gone."""
        await self._check(stream, after)
        return Following(self._follow(stream, after))

    @abstractmethod
    async def _check(self, stream: str, after: str) -> None: ...

    @abstractmethod
    def _follow(self, stream: str, after: str) -> AsyncIterator[LoggedEvent]: ...

    async def aclose(self) -> None:  # noqa: B027 - most logs hold nothing open
        """Let go of what the log holds open (connections); the streams stay."""


class Following(AsyncIterator[LoggedEvent]):
    """A reader's events of one stream, as :meth:`EventLog.follow` gives them. An
    ``EventStream`` over them ends as soon as its replica starts draining: its client
    reconnects with the last id it saw and gets the rest from any replica."""

    __slots__ = ("_events",)

    def __init__(self, events: AsyncIterator[LoggedEvent]) -> None:
        self._events = events

    def __aiter__(self) -> Following:
        return self

    async def __anext__(self) -> LoggedEvent:
        return await anext(self._events)

    async def aclose(self) -> None:
        """Stop following (what the reader holds open is let go)."""
        close = getattr(self._events, "aclose", None)
        if close is not None:
            await close()


def check_name(stream: str) -> None:
    """Stream names are ids the application makes (e.g. a uuid), not user text."""
    if not stream or len(stream) > 200 or not stream.isprintable() or "{" in stream or "}" in stream:
        raise ValueError(f"a stream name is 1 to 200 printable characters but braces, got {stream!r}")


class WrittenStreams:
    """Stream names a log keeps for the lost-stream check (the Redis log: those it has
    written and not closed; the memory log: those it dropped unclosed), newest last.
    Bounded (the oldest names go first): at most ``limit`` names, and a name forgotten
    only loses the check."""

    __slots__ = ("_names", "limit")

    def __init__(self, limit: int = 65_536) -> None:
        self._names: dict[str, None] = {}
        self.limit = limit

    def __contains__(self, stream: str) -> bool:
        return stream in self._names

    def add(self, stream: str) -> None:
        """Note ``stream`` as written now (it moves to the newest end)."""
        if stream in self._names:
            del self._names[stream]  # put back below, at the newest end
        elif len(self._names) >= self.limit:
            del self._names[next(iter(self._names))]  # the one written longest ago
        self._names[stream] = None

    def discard(self, stream: str) -> None:
        self._names.pop(stream, None)


def lost(stream: str) -> UnknownStream:
    """What an append to a stream that is gone since this log wrote it raises."""
    return UnknownStream(f"{stream} (gone since this log wrote it: its events were lost)")


def new_writer() -> str:
    """A writer name for a take-over that names none: it still fences out the writer
    it replaces."""
    return "taker-" + secrets.token_hex(8)


class _Stream:
    __slots__ = ("events", "first", "changed", "written_at", "closed_at", "writer")

    def __init__(self, max_events: int, now: float) -> None:
        self.events: deque[LoggedEvent] = deque(maxlen=max_events)
        self.first = 1  # the number of events[0]
        self.changed = asyncio.Event()  # replaced after each wake-up
        self.written_at = now
        self.closed_at: float | None = None
        self.writer = ""  # "" until a writer names itself

    def check_writer(self, stream: str, writer: str) -> None:
        """Refuse ``writer`` if another one took the stream over; the first named is it."""
        if writer:
            if self.writer and self.writer != writer:
                raise WriterReplaced(f"stream {stream!r} is written by another writer now")
            self.writer = writer

    def wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class MemoryEventLog(EventLog):
    """Streams kept in this process (one replica, or tests): event ids are 1, 2, 3, …

    ``max_streams`` bounds how many it keeps. A new stream beyond it first makes room:
    closed streams past ``keep_s`` and abandoned ones go, then, if none did, the stream
    closed longest ago, though within its ``keep_s`` (a busy service keeps serving new
    streams; a reader coming back that late for a finished one gets :class:`UnknownStream`).
    Only when every stream is still being written does :meth:`append` raise
    ``OverflowError``.
    """

    def __init__(
        self,
        *,
        max_streams: int = 10_000,
        max_events: int = 100_000,
        keep_s: float = 300.0,
        writer_timeout_s: float = 60.0,
    ) -> None:
        super().__init__(max_events=max_events, keep_s=keep_s, writer_timeout_s=writer_timeout_s)
        if max_streams < 1:
            raise ValueError(f"max_streams must be at least 1, got {max_streams}")
        self.max_streams = max_streams
        self._streams: dict[str, _Stream] = {}
        self._closed: deque[str] = deque()  # names in the order they were closed (some since dropped)
        #: Abandoned streams it dropped (the one way it loses a stream still written):
        #: their writer's next append is refused, never made again.
        self._dropped = WrittenStreams(max(65_536, 2 * max_streams))

    def __len__(self) -> int:
        return len(self._streams)

    async def append(self, stream: str, data: str, event: str = "", *, writer: str = "") -> str:
        now = time.monotonic()
        kept = self._streams.get(stream)
        if kept is None:
            check_name(stream)
            if stream in self._dropped:
                raise lost(stream)
            if len(self._streams) >= self.max_streams:
                self._drop_old(now)
                if len(self._streams) >= self.max_streams:
                    raise OverflowError(f"the event log holds {self.max_streams} streams (max_streams)")
            kept = self._streams[stream] = _Stream(self.max_events, now)
        elif kept.closed_at is not None:
            raise ValueError(f"stream {stream!r} is closed")
        kept.check_writer(stream, writer)
        if len(kept.events) == self.max_events:
            kept.first += 1  # the oldest falls out of the deque
        number = kept.first + len(kept.events)
        kept.events.append(LoggedEvent(str(number), event, data))
        kept.written_at = now
        kept.wake()
        return str(number)

    async def touch(self, stream: str, *, writer: str = "") -> None:
        kept = self._streams.get(stream)
        if kept is None:
            raise UnknownStream(stream)
        kept.check_writer(stream, writer)
        kept.written_at = time.monotonic()

    async def close(self, stream: str, *, writer: str = "") -> None:
        kept = self._streams.get(stream)
        if kept is None:
            raise UnknownStream(stream)
        if kept.closed_at is None:
            kept.check_writer(stream, writer)
            kept.closed_at = time.monotonic()
            kept.wake()
            self._closed.append(stream)

    async def take_over(self, stream: str, *, writer: str = "") -> bool:
        kept = self._live(stream)
        now = time.monotonic()
        if kept.closed_at is not None or now - kept.written_at <= self.writer_timeout_s:
            return False
        kept.written_at = now
        kept.writer = writer or new_writer()
        return True

    async def release(self, stream: str, *, writer: str = "") -> None:
        kept = self._live(stream)
        if kept.closed_at is None and not (writer and kept.writer and kept.writer != writer):
            kept.written_at = time.monotonic() - self.writer_timeout_s - 1.0
            kept.wake()

    async def read(self, stream: str) -> list[LoggedEvent]:
        return list(self._live(stream).events)

    async def _check(self, stream: str, after: str) -> None:
        if after and not (after.isdigit() and len(after) < 20):
            raise ValueError(f"not an event id of this log: {after!r}")
        kept = self._live(stream)
        last = kept.first + len(kept.events) - 1  # the number of the newest event
        if int(after or 0) > last:
            raise ValueError(f"stream {stream!r} has no event {after!r} yet")
        silent = time.monotonic() - kept.written_at > self.writer_timeout_s
        if kept.closed_at is None and silent and int(after or 0) == last:
            raise StreamAbandoned(f"stream {stream!r}: its writer went silent")

    async def _follow(self, stream: str, after: str) -> AsyncIterator[LoggedEvent]:
        sent = int(after or 0)  # the number of the last event the reader has
        kept = self._live(stream)  # held: a reader that is slow at the end still finishes
        while True:
            fresh = list(itertools.islice(kept.events, max(sent + 1 - kept.first, 0), None))
            for item in fresh:
                yield item
            if fresh:
                sent = int(fresh[-1].id)
                continue  # the stream may have grown (or closed) while they were taken
            if kept.closed_at is not None:
                return
            waited = kept.written_at + self.writer_timeout_s - time.monotonic()
            if waited <= 0:
                raise StreamAbandoned(f"stream {stream!r}: its writer went silent")
            try:
                async with asyncio.timeout(waited):
                    await kept.changed.wait()
            except TimeoutError:
                continue  # checked again above: a touch() may have come meanwhile

    def _live(self, stream: str) -> _Stream:
        kept = self._streams.get(stream)
        if kept is None or (kept.closed_at is not None and time.monotonic() - kept.closed_at > self.keep_s):
            self._streams.pop(stream, None)
            raise UnknownStream(stream)
        return kept

    def _drop_old(self, now: float) -> None:
        for name, kept in list(self._streams.items()):
            if kept.closed_at is not None:
                if now - kept.closed_at > self.keep_s:
                    del self._streams[name]
            elif now - kept.written_at > self.writer_timeout_s + self.keep_s:
                del self._streams[name]  # abandoned, and its readers told so long ago
                self._dropped.add(name)
        while len(self._streams) >= self.max_streams and self._closed:
            name = self._closed.popleft()
            closed = self._streams.get(name)
            if closed is not None and closed.closed_at is not None:
                del self._streams[name]  # finished longest ago: its place goes to a new stream
        if len(self._closed) > 2 * self.max_streams:  # names of streams dropped meanwhile
            self._closed = deque(name for name in self._closed if name in self._streams)
