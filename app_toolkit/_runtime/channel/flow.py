"""Flow control per stream: a sender may have at most ``STREAM_WINDOW`` bytes of one
stream's frames that the receiver has not consumed yet.

A connection carries many streams, so the socket's own back-pressure cannot slow one of
them down: a client that reads an SSE stream slowly would otherwise make the proxy buffer
everything a fast replica produces. Instead the receiver returns CREDIT frames as its
consumer takes frames (``Credits``), and the sender waits while its window is full
(``Window``). Both directions use it: response bodies, stream items and WebSocket messages
from the replica, WebSocket messages to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import Message

#: Bytes of one stream in flight between a producer and its consumer.
STREAM_WINDOW = 1 << 20
#: What one frame costs beyond its payload (its header, its place in a queue), so a
#: stream of tiny frames is bounded too.
FRAME_COST = 128


def frame_cost(payload_bytes: int) -> int:
    return payload_bytes + FRAME_COST


def parts_cost(parts: list[bytes]) -> int:
    """The cost of a frame about to be sent as ``parts`` (what the receiver will count)."""
    return frame_cost(sum(len(part) for part in parts))


class Window:
    """The sender's side: bytes sent on one stream and not yet credited back."""

    __slots__ = ("size", "outstanding", "_waiter", "closed")

    def __init__(self, size: int = STREAM_WINDOW) -> None:
        self.size = size
        self.outstanding = 0
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False

    def sent(self, cost: int) -> None:
        self.outstanding += cost

    def credited(self, amount: int) -> None:
        self.outstanding -= amount
        if self.outstanding < self.size:
            self._wake()

    def close(self) -> None:
        """The stream ended: nobody waits for credit any more."""
        self.closed = True
        self._wake()

    async def room(self) -> None:
        """Wait while the window is full (returns at once once the stream ended)."""
        while self.outstanding >= self.size and not self.closed:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Credits:
    """The receiver's side: bytes its consumer took, returned to the sender in steps of
    a quarter window (one small frame per 256 KiB)."""

    __slots__ = ("_grant", "_pending")

    def __init__(self, grant: Callable[[int], None]) -> None:
        self._grant = grant
        self._pending = 0

    def consumed(self, cost: int) -> None:
        self._pending += cost
        if self._pending >= STREAM_WINDOW // 4:
            amount, self._pending = self._pending, 0
            self._grant(amount)


class Inbound:
    """WebSocket messages from the client that the app has not received yet; each one the
    app takes is credited back to whoever sent it."""

    __slots__ = ("_queue", "_credits")

    def __init__(self, credit: Callable[[int], None]) -> None:
        self._queue: asyncio.Queue[tuple[Message, int]] = asyncio.Queue()
        self._credits = Credits(credit)

    def put(self, message: Message, cost: int = 0) -> None:
        self._queue.put_nowait((message, cost))

    async def get(self) -> Message:
        message, cost = await self._queue.get()
        if cost:
            self._credits.consumed(cost)
        return message
