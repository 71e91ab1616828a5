"""What a server of the front offers one request beyond ASGI: its :class:`RequestLink`,
in the request's scope. Every server the front runs under gives one: our HTTP protocol
(``http_guard.py``: a :class:`ConnectionLink` over the connection's :class:`Writes`, which
hold a complete response's head until its body comes so both leave in one write, gather a
stream's chunks that came together, and record the phases of a handed-off connection as
its bytes leave), and the in-process test client's transport (``inprocess.MemoryLink``).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Protocol

from app_toolkit._runtime.connection_table import Handed
from app_toolkit._runtime.front.uvicorn_compat import RequestResponseCycle

#: The scope key of a request's :class:`RequestLink` (set by the protocol).
REQUEST_LINK = "app_toolkit.request_link"
JOIN_MAX = 64 << 10  # a held head and a body smaller than this leave as one write


class Writes:
    """The transport as uvicorn's response cycles see it: it can hold a response head
    back until its body is written, so a complete response costs one write (one system
    call, one wake-up of the client) instead of two. A whole response (a held head and
    its body) and gathered writes leave at :meth:`release`, which the protocol calls when
    the response is complete: there it knows they end the response."""

    __slots__ = (
        "transport",
        "hold",
        "held",
        "body",
        "gathered",
        "starting",
        "sent",
        "began",
        "closing",
        "ended",
    )

    def __init__(self, transport: asyncio.Transport, sent: int | None = None) -> None:
        self.transport = transport
        self.hold = False  # the next write is a head to hold
        self.held: bytes | None = None
        self.body: bytes | None = None  # the held head's body
        self.gathered: list[bytes] | None = None  # writes kept for one write (gather_writes)
        #: A handed-off connection whose response has not started: its first write records it.
        self.starting: Handed | None = None
        #: A handed-off connection's bytes written so far (connection_table.bytes_written).
        self.sent = sent
        #: Where the response under way began in ``sent`` (its first write's start).
        self.began: int | None = None
        #: How the connection ends when a response cycle closes it (the protocol's choice:
        #: lingering while the request's body still arrives); None: the transport's close.
        self.closing: Callable[[], None] | None = None
        self.ended = False  # the server's side has ended (a lingering close): nothing more is written

    def write(self, data: bytes) -> None:
        if self.gathered is not None:
            self.gathered.append(bytes(data))
            return
        if self.held is None and self.hold:
            self.hold = False
            self.held = bytes(data)
            return
        if self.held is not None:
            if self.body is None:  # it leaves with its head when the response is complete
                self.body = bytes(data)
                return
            self.release()
        if self.starting is not None:
            self._started()
        self._write(data)

    def _write(self, data: bytes) -> None:
        if self.ended or self.transport.is_closing():
            # Closed under the response (the parser answered 400 to bytes that followed
            # its request, and closed): nothing more may follow that answer on the wire
            # (and once the close is done, uvloop's transport raises on a write).
            return
        if self.sent is not None:
            self.sent += len(data)
        self.transport.write(data)

    def release(self, ending: Handed | None = None) -> bool:
        """Write what is held or gathered (nothing more is coming to join it). ``ending``:
        it ends the response, and the handed-off connection is between requests after it;
        True if that was recorded (there was something to write)."""
        self.hold = False
        gathered, self.gathered = self.gathered, None
        held, body, self.held, self.body = self.held, self.body, None, None
        rest = None  # a large body, written after its head
        if gathered:
            data = b"".join(gathered)
        elif held is None:
            return False
        elif body is None:
            data = held
        elif len(body) < JOIN_MAX:
            data = held + body
        else:
            data, rest = held, body
        if ending is not None and self.sent is not None:
            # Recorded before the write, and kept until the next request: a replica killed
            # after it leaves ENDING, which the proxy takes for IDLE once the kernel has
            # ``end`` (and for a request whose response never left, while the count is
            # still where the response began).
            if self.starting is not None:  # nothing of the response written before
                self.starting, self.began = None, self.sent
            end = self.sent + len(data) + (len(rest) if rest is not None else 0)
            ending.ending(end, self.began)
        elif self.starting is not None:
            self._started()
        self._write(data)
        if rest is not None:
            self._write(rest)
        return ending is not None and self.sent is not None

    def _started(self) -> None:
        assert self.starting is not None
        self.began = self.sent
        self.starting.started(self.sent)  # before the write, which the loop may flush later
        self.starting = None

    def close(self) -> None:
        self.release()
        if self.closing is not None:
            self.closing()
        else:
            self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()


class RequestLink(Protocol):
    """What the server offers the front for one HTTP request, beyond ASGI.

    ``on_client_left`` (set by the front): called when the client goes away before its
    response is complete, so the front need not keep a task per request waiting on
    ``receive()`` for the ``http.disconnect`` message. ``handed``: the connection's record
    in the table the node's proxy shares (a handed-off connection), else None.
    """

    on_client_left: Callable[[], None] | None
    handed: Handed | None

    def body_ready(self) -> bool:
        """The next ``receive()`` returns at once (no wait needs a timeout)."""
        ...

    def body_arriving(self) -> bool:
        """The body is still arriving from the client: a deadline passing now is the
        upload's (408), not the app's (504)."""
        ...

    def join_head_and_body(self) -> None:
        """The response's head and its whole body come next: write them together."""
        ...

    def gather_writes(self) -> None:
        """Keep what the response writes until :meth:`release`, then write it at once."""
        ...

    def release(self) -> None:
        """Write anything still held (after the response, or if sending it failed)."""
        ...

    def abort(self) -> None:
        """Cut the response off (it failed after its head): the client must not take what
        it got for a complete response."""
        ...


class ConnectionLink:
    """Our HTTP protocol's :class:`RequestLink`: ``on_client_left`` is called from
    ``connection_lost``; writes go to the connection's :class:`Writes`."""

    __slots__ = ("on_client_left", "handed", "_writes", "_cycle")

    def __init__(
        self, writes: Writes, cycle: RequestResponseCycle | None = None, handed: Handed | None = None
    ) -> None:
        self.on_client_left: Callable[[], None] | None = None
        #: The connection's record in the table the proxy shares (a handed-off one).
        self.handed = handed
        self._writes = writes
        # Weak: the link sits in the cycle's scope, and a strong reference back would make
        # every request's scope, cycle and what they hold a reference cycle, freed only
        # by the garbage collector (that cost the server about a tenth of its throughput).
        self._cycle = weakref.ref(cycle) if cycle is not None else None

    def body_ready(self) -> bool:
        """The app's next ``receive()`` returns at once: a piece of the body (or its end,
        or the client's leaving) has arrived, so no wait needs a timeout."""
        cycle = self._cycle() if self._cycle is not None else None
        if cycle is None:  # not told (or gone): every wait is bounded
            return False
        return cycle.message_event.is_set() or cycle.disconnected or cycle.response_complete

    def body_arriving(self) -> bool:
        """The request's body is still arriving: not all of it is here, and the connection
        is reading it — not held back because the app has not taken what came (uvicorn
        pauses reading then), nor waiting for the app's first read to send ``100
        Continue``. A deadline passing now is the upload's (408), not the app's (504)."""
        cycle = self._cycle() if self._cycle is not None else None
        if cycle is None or not cycle.more_body or cycle.disconnected or cycle.waiting_for_100_continue:
            return False
        return not cycle.flow.read_paused

    def join_head_and_body(self) -> None:
        """The response's head and its whole body come next: write them together."""
        self._writes.hold = True

    def gather_writes(self) -> None:
        """Keep what the response writes until :meth:`release`, then write it at once
        (several body chunks, each still its own chunk on the wire, in one write)."""
        self._writes.gathered = []

    def release(self) -> None:
        """Write anything still held (after the response, or if sending it failed)."""
        self._writes.release()

    def abort(self) -> None:
        """Cut the connection off (a stream failed mid-way): the client must not take
        what it got for a complete response."""
        self.on_client_left = None
        self._writes.gathered = self._writes.held = self._writes.body = None
        self._writes.transport.abort()
