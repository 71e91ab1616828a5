"""A replica's drain as the streams and WebSockets it serves see it (docs/fault-tolerance.md,
"Draining").

When a replica starts draining, its open responses run on for up to
``graceful_shutdown_timeout_s``: only a stream whose client can resume elsewhere losing
nothing (an ``EventStream`` over an event log, or one its author marks) ends at once.
At the deadline every stream and WebSocket still open ends the way its clients
understand (a final event, a close frame with 1012), and the drain gives them a moment
to write it. A hurried drain (``app-toolkit run --reload``) is at its deadline at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger("app_toolkit.replica")

#: How long a drain past its deadline waits for the streams it ended to write their last
#: event (for their requests to end), before it goes on (lifespan shutdown; the process
#: is stopped next).
LAST_EVENT_S = 1.0

#: What a watcher does when its stream or WebSocket must end.
End = Callable[[], Awaitable[None]]


class DrainSignal:
    """One replica's drain: ``started`` when it takes no more requests, ``deadline`` when
    its grace period is over (at once when hurried). Every open stream and WebSocket
    watches it (:meth:`watch`)."""

    __slots__ = ("started", "deadline", "watching")

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.deadline = asyncio.Event()
        #: Open streams and WebSockets watching (not ended yet).
        self.watching = 0

    def begin(self, hurry: bool = False) -> None:
        """The drain starts; ``hurry``: every stream and WebSocket ends now, not at the
        deadline."""
        self.started.set()
        if hurry:
            self.deadline.set()

    def end_streams(self) -> None:
        """The grace period is over: every stream and WebSocket still open ends."""
        self.started.set()
        self.deadline.set()

    def watch(self, end: End, *, at_start: bool = False) -> DrainWatch:
        """Call ``end`` once when the stream or WebSocket watching must end: when the drain
        starts (``at_start``), else at its deadline. Close the watch when it has ended."""
        self.watching += 1
        return DrainWatch(self, end, at_start)


class DrainWatch:
    """One open stream or WebSocket watching its replica's drain (made by
    :meth:`DrainSignal.watch`); its task is its own, cancelled by :meth:`close`."""

    __slots__ = ("_signal", "_end", "at_start", "_task", "_closed")

    def __init__(self, signal: DrainSignal, end: End, at_start: bool) -> None:
        self._signal = signal
        self._end = end
        #: May turn True later (a stream that proves resumable): ``due`` then says so.
        self.at_start = at_start
        self._closed = False
        self._task = asyncio.ensure_future(self._run())

    @property
    def due(self) -> bool:
        """The stream must end now (checked by a stream before it waits for more)."""
        signal = self._signal
        return signal.deadline.is_set() or (self.at_start and signal.started.is_set())

    def end_at_start(self) -> None:
        """The stream turned out resumable: it ends as soon as the drain starts."""
        self.at_start = True

    async def _run(self) -> None:
        await self._signal.started.wait()
        if not self.at_start:
            await self._signal.deadline.wait()
        try:
            await self._end()
        except Exception:  # a client gone meanwhile, say: the stream ends anyway
            logger.exception("Ending a stream or WebSocket at its replica's drain failed")

    async def close(self) -> None:
        """The stream or WebSocket ended: stop watching (an ``end`` under way is cancelled)."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self._task.done():
                self._task.cancel()
            await asyncio.wait({self._task})
        finally:
            self._signal.watching -= 1
