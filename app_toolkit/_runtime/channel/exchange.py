"""One request in flight, as its caller sees it: the answers that come back for it, in
order, whatever carries them (a channel connection, or an in-process call), and the
flow-control windows of both directions (``flow.py``)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import TypeVar

from app_toolkit._runtime.channel.flow import Credits, Window
from app_toolkit._runtime.messages import TERMINAL, Answer, ClientMessage, Request, body_follows

A = TypeVar("A", bound=Answer)


class Exchange:
    """One request in flight: the answers that come back for it, in order.

    ``inflow`` counts what arrived and was not consumed yet (an in-process producer waits
    on it; over the channel, consuming grants ``credits`` to the replica). ``outflow``
    counts the client's messages (WebSocket messages, the pieces of a streamed request
    body) sent to the replica and not yet consumed there. A streamed body's window opens
    with the replica's first credit, which it grants when it admits the request: nothing
    of the body leaves before, so a refused request can still go whole to another replica.
    """

    __slots__ = (
        "_items",
        "_waiter",
        "_cancel",
        "_forward",
        "finished",
        "inflow",
        "outflow",
        "credits",
        "received_cost",
    )

    def __init__(
        self,
        cancel: Callable[[], None],
        forward: Callable[[ClientMessage], int] | None = None,
        credits: Credits | None = None,
        request: Request | None = None,
    ) -> None:
        self._items: collections.deque[tuple[Answer, int]] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._cancel = cancel
        self._forward = forward
        self.finished = False
        self.inflow = Window()
        self.outflow = Window()
        if body_follows(request):
            self.outflow.sent(self.outflow.size)  # until the replica admits it
        self.credits = credits
        #: The flow-control cost of the answer :meth:`recv` returned last: a streamed
        #: one's size as it crossed the channel (``flow.frame_cost``).
        self.received_cost = 0

    def send(self, message: ClientMessage) -> None:
        """Send the client's next message to the replica; wait for :meth:`room_to_send`
        before each."""
        if self._forward is not None and not self.finished:
            self.outflow.sent(self._forward(message))

    async def room_to_send(self) -> None:
        await self.outflow.room()

    def credited(self, amount: int) -> None:
        """The replica consumed ``amount`` of what :meth:`send` sent."""
        self.outflow.credited(amount)

    def push(self, answer: Answer, cost: int = 0) -> None:
        if isinstance(answer, TERMINAL):
            self.finished = True
            self.outflow.close()
        self._items.append((answer, cost))
        self.inflow.sent(cost)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _consumed(self, cost: int) -> None:
        if cost:
            self.inflow.credited(cost)
            if self.credits is not None and not self.finished:
                self.credits.consumed(cost)

    def take_ready(self, kind: type[A]) -> list[A]:
        """The answers of type ``kind`` that are next in line and already here, removed."""
        items = self._items
        taken: list[A] = []
        while items:
            answer, cost = items[0]
            if not isinstance(answer, kind):
                break
            items.popleft()
            taken.append(answer)
            self._consumed(cost)
        return taken

    def next_is(self, kind: type[Answer]) -> bool:
        return bool(self._items) and isinstance(self._items[0][0], kind)

    async def recv(self) -> Answer:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        answer, cost = self._items.popleft()
        self._consumed(cost)
        self.received_cost = cost
        return answer

    def refuse(self, answer: Answer) -> None:
        """The caller ends the request with ``answer`` (say, a body over its limit): the
        replica is told to cancel it, and ``answer`` comes after what arrived already
        (no-op once the request finished)."""
        if not self.finished:
            self.cancel()
            self.push(answer)

    def cancel(self) -> None:
        """Ask the replica to cancel this request (no-op once it finished)."""
        self.outflow.close()
        self.inflow.close()
        if not self.finished:
            self.finished = True
            self._cancel()
