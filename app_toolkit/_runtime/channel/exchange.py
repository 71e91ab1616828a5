"""One request in flight, as its caller sees it: the frames that come back for it, in
order, whatever carries them (a channel connection, or an in-process call)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any

from app_toolkit._runtime.channel.frames import Kind

#: Kinds after which nothing more comes back for a request.
TERMINAL = frozenset({Kind.RESPONSE, Kind.END, Kind.RESULT, Kind.FAILURE, Kind.REJECTED, Kind.LOST})


class Exchange:
    """One request in flight: the frames that come back for it, in order."""

    __slots__ = ("_items", "_waiter", "_cancel", "_forward", "finished")

    def __init__(
        self, cancel: Callable[[], None], forward: Callable[[Kind, Any], None] | None = None
    ) -> None:
        self._items: collections.deque[tuple[Kind, Any]] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._cancel = cancel
        self._forward = forward
        self.finished = False

    def send(self, kind: Kind, message: Any) -> None:
        """Send a further message of this request to the replica (WebSocket input)."""
        if self._forward is not None and not self.finished:
            self._forward(kind, message)

    def push(self, kind: Kind, message: Any) -> None:
        if kind in TERMINAL:
            self.finished = True
        self._items.append((kind, message))
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take_ready(self, kind: Kind) -> list[Any]:
        """The messages of ``kind`` that are next in line and already here, removed."""
        items = self._items
        taken = []
        while items and items[0][0] is kind:
            taken.append(items.popleft()[1])
        return taken

    def next_is(self, kind: Kind) -> bool:
        return bool(self._items) and self._items[0][0] is kind

    async def recv(self) -> tuple[Kind, Any]:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    def cancel(self) -> None:
        """Ask the replica to cancel this request (no-op once it finished)."""
        if not self.finished:
            self.finished = True
            self._cancel()
