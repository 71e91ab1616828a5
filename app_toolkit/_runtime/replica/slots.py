"""A replica's slots: it never runs more than ``max_ongoing_requests`` at once.

Over the channel, :meth:`ReplicaSlots.admit` takes a slot or refuses (busy: the caller's
router tries another replica; draining: it is going away), and the request's ``serve``
gives it back (``unserved``, for one cancelled before it ran). On a client connection
the replica owns (direct ingress), the front asks :meth:`ReplicaSlots.has_room` and the
request holds its :meth:`ReplicaSlots.slot` with ``async with``, taken in the same step.
While draining, ends of requests wake the drain, and late requests are refused until
none came for a moment (:meth:`ReplicaSlots.linger`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from app_toolkit._runtime.messages import BUSY, DRAINING, Rejected
from app_toolkit._runtime.waiting import wait_event
from app_toolkit.config import DeploymentConfig

LINGER_QUIET_S = 0.25  # a drained replica stops once no request came for this long
LINGER_MAX_S = 2.0


class ReplicaSlots:
    """The slots of one replica (``ReplicaCore`` is one)."""

    config: DeploymentConfig  # its max_ongoing_requests is the number of slots

    def __init__(self) -> None:
        self.ongoing = 0
        #: Of those, requests on client connections this replica owns (direct ingress,
        #: :meth:`slot`): no caller's dispatcher counts them, so this process reports them.
        self.direct_ongoing = 0
        self.draining = False
        #: Set when a request of a draining replica ends (admit() refuses while draining, so
        #: only a drain waits for it, and only draining requests end it).
        self._one_ended = asyncio.Event()
        self._drained_at = 0.0
        self._last_refused = 0.0
        #: Called when a direct slot is given back (the front's dispatcher of this
        #: deployment: a request waiting there for a slot here may go).
        self.on_direct_end: Callable[[], None] | None = None

    def admit(self, beyond_limit: bool = False) -> Rejected | None:
        """Take a slot for a request over the channel (None), or say why not: the one
        place a replica decides between busy and draining. ``beyond_limit``: a broadcast's
        call, admitted even when ``max_ongoing_requests`` are running (it must reach every
        replica); a draining replica refuses it too."""
        if self.draining:
            self._last_refused = asyncio.get_running_loop().time()
            return DRAINING
        if self.ongoing >= self.config.max_ongoing_requests and not beyond_limit:
            return BUSY
        self.ongoing += 1
        return None

    def unserved(self) -> None:
        """Give back a slot ``admit`` took (a request that ended, or one cancelled before
        ``serve`` ever ran: the channel server's ``_cancel``)."""
        self.ongoing -= 1
        if self.draining:
            self._one_ended.set()

    def has_room(self) -> bool:
        """A request on a client connection this replica owns would be admitted now (see
        :meth:`admit`); its :meth:`slot` is taken in the same step of the event loop."""
        if self.draining:
            self._last_refused = asyncio.get_running_loop().time()
            return False
        return self.ongoing < self.config.max_ongoing_requests

    def direct_count(self) -> int:
        """Requests and WebSockets of connections this replica owns that run now."""
        return self.direct_ongoing

    def slot(self) -> DirectSlot:
        """The slot of a request or WebSocket of a client connection this replica owns,
        held with ``async with`` once :meth:`has_room` said yes."""
        return DirectSlot(self)

    async def wait_until(self, ongoing: int, deadline: float) -> None:
        """Until no more than ``ongoing`` requests are left, or the loop's clock reaches
        ``deadline`` (checked every ``graceful_shutdown_wait_loop_s`` at least)."""
        loop = asyncio.get_running_loop()
        while self.ongoing > ongoing and loop.time() < deadline:
            wait_s = min(self.config.graceful_shutdown_wait_loop_s, max(deadline - loop.time(), 0))
            self._one_ended.clear()
            await wait_event(self._one_ended, wait_s)

    async def linger(self) -> None:
        """After draining, keep refusing late requests until none arrived for a moment.

        A caller that has not yet seen the table without this replica may still send to
        it; refused (not lost), such a request is retried on another replica.
        """
        loop = asyncio.get_running_loop()
        give_up = loop.time() + LINGER_MAX_S
        while loop.time() < give_up:
            quiet_until = max(self._drained_at, self._last_refused) + LINGER_QUIET_S
            if loop.time() >= quiet_until:
                return
            await asyncio.sleep(quiet_until - loop.time())


class DirectSlot:
    """One slot of a replica, held by a request or WebSocket of a connection it owns."""

    __slots__ = ("_slots",)

    def __init__(self, slots: ReplicaSlots) -> None:
        self._slots = slots

    async def __aenter__(self) -> None:
        slots = self._slots
        slots.ongoing += 1
        slots.direct_ongoing += 1

    async def __aexit__(self, *exc_info: object) -> None:
        slots = self._slots
        slots.direct_ongoing -= 1
        slots.unserved()
        if slots.on_direct_end is not None:
            slots.on_direct_end()
