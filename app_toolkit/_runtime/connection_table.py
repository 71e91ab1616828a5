"""Where each handed-off client connection stands, in memory the node's proxy and an
ingress replica share (direct ingress, docs/architecture.md "When a replica dies").

The proxy keeps its own copy of every connection it hands to a replica, so the
connection outlives the replica. The replica records, with plain byte stores into this
table (no system call, no message), the phase of each connection it serves: between
requests, a request being read, its app running, its response started, its response's
last bytes being written, done. When the replica dies, the proxy reads the phase and does
what is right for it: serve the connection elsewhere (nothing of a request was read, or
the last response is whole), answer 503 (a request was read but never ran) or 502 (it may
have run), or close it (a response was under way).

One table per (proxy, replica) pair: a ``memfd`` the proxy makes and passes with its first
hand-off message, one record of :data:`RECORD_BYTES` per slot (the replica's
``max_connections``); pages that no connection touches take no memory.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import struct
from dataclasses import dataclass
from enum import IntEnum


class Phase(IntEnum):
    """Where a handed-off connection stands (the first byte of its record)."""

    FREE = 0  # no connection in this slot
    HANDED = 1  # passed to the replica; nothing of it read there yet
    IDLE = 2  # between requests: nothing of the next request read
    HEAD = 3  # a request's bytes being read (recorded before the read); its app not called yet
    #: The request's head is whole: its app may have run (where the kernel counts nothing
    #: of the connection; else recorded as STARTED, its response from ``start`` on).
    RUNNING = 4
    #: The request's app may run and its response follows (or the connection upgraded to
    #: a WebSocket): its bytes are written from the record's ``start`` on, so a replica
    #: killed before any of them reached the kernel leaves a request whose app may have
    #: run and nothing of its answer (502); one killed after, a response under way.
    STARTED = 5
    CLOSED = 6  # the replica is done with it (and shuts it down)
    #: The response's last bytes written (or being written), and the connection between
    #: requests after them until the next request's bytes come: whole (so IDLE) once the
    #: connection's written bytes (:func:`bytes_written`) reach the record's ``end``;
    #: short of it, a response under way (STARTED), unless none of it is there (the
    #: count is still at ``start``: its app ran, as RUNNING).
    ENDING = 7


#: Bytes per connection: the phase, the request id's length, the request id, and (last
#: sixteen) the ``start`` of a STARTED or ENDING response and the ``end`` of an ENDING one.
RECORD_BYTES = 256
_START_AT = RECORD_BYTES - 16
_END_AT = RECORD_BYTES - 8
_END = struct.Struct("<Q")
_ID_MAX = _START_AT - 2
#: A response's ``start`` when it is unknown (the kernel counts nothing of the connection).
_NO_START = (1 << 64) - 1


class ConnectionTable:
    """The shared records of one replica's handed-off connections, by slot."""

    __slots__ = ("memory", "slots")

    def __init__(self, memory: mmap.mmap, slots: int) -> None:
        #: Writers store phases with ``memory[offset(slot)] = phase`` (one byte store).
        self.memory = memory
        self.slots = slots

    @classmethod
    def create(cls, slots: int) -> tuple[ConnectionTable, int]:
        """A new zeroed table (every slot FREE) and the descriptor that shares it (the
        caller passes it on, then closes it)."""
        fd = os.memfd_create("app-toolkit-connections", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, slots * RECORD_BYTES)
            memory = mmap.mmap(fd, slots * RECORD_BYTES)
        except OSError:
            os.close(fd)
            raise
        return cls(memory, slots), fd

    @classmethod
    def attach(cls, fd: int, slots: int) -> ConnectionTable:
        """The table another process made (``fd`` is closed here; the mapping stays)."""
        try:
            if os.fstat(fd).st_size < slots * RECORD_BYTES:
                raise ValueError(f"a connection table of {slots} slots is bigger than what was shared")
            return cls(mmap.mmap(fd, slots * RECORD_BYTES), slots)
        finally:
            os.close(fd)

    @staticmethod
    def offset(slot: int) -> int:
        return slot * RECORD_BYTES

    def phase(self, slot: int) -> Phase:
        return Phase(self.memory[slot * RECORD_BYTES])

    def set_phase(self, slot: int, phase: Phase) -> None:
        self.memory[slot * RECORD_BYTES] = phase

    def set_request_id(self, slot: int, request_id: str) -> None:
        """Record the id of the request the connection is serving (cut to 238 bytes)."""
        data = request_id.encode("latin-1", "replace")[:_ID_MAX]
        start = slot * RECORD_BYTES + 1
        self.memory[start] = len(data)
        self.memory[start + 1 : start + 1 + len(data)] = data

    def request_id(self, slot: int) -> str:
        start = slot * RECORD_BYTES + 1
        length = self.memory[start]
        return self.memory[start + 1 : start + 1 + length].decode("latin-1")

    def end(self, slot: int) -> int:
        """Where the connection's ENDING response ends, in :func:`bytes_written`."""
        value: int = _END.unpack_from(self.memory, slot * RECORD_BYTES + _END_AT)[0]
        return value

    def start(self, slot: int) -> int | None:
        """Where the connection's STARTED or ENDING response starts, in
        :func:`bytes_written`; None when that is unknown (the kernel counts nothing of
        the connection, or a WebSocket began behind a response still going)."""
        value: int = _END.unpack_from(self.memory, slot * RECORD_BYTES + _START_AT)[0]
        return None if value == _NO_START else value

    def close(self) -> None:
        self.memory.close()


@dataclass(slots=True)
class Handed:
    """A connection the proxy handed over and keeps a copy of: the replica records its
    phases at ``offset`` of ``table.memory`` and, being done with it, shuts ``sock`` down
    (closing its own descriptor would not end a connection the proxy also holds)."""

    peer: socket.socket
    table: ConnectionTable
    slot: int
    offset: int
    sock: socket.socket

    def record(self, phase: Phase) -> None:
        self.table.memory[self.offset] = phase

    def started(self, start: int | None) -> None:
        """The request's app may run, and its response's bytes follow from ``start`` (in
        :func:`bytes_written`; None if unknown) on: recorded when its head is whole, and
        again just before the response's first write."""
        self._start_at(start)
        self.record(Phase.STARTED)

    def ending(self, end: int, start: int | None) -> None:
        """The response's last bytes are written next (or were: a stream's), and the
        connection is between requests after them: the response is whole once
        :func:`bytes_written` is ``end``. ``start``: where the response began (a replica
        killed before any of it reached the kernel leaves nothing of it sent, a 502);
        None if unknown."""
        self._start_at(start)
        _END.pack_into(self.table.memory, self.offset + _END_AT, end)
        self.record(Phase.ENDING)

    def _start_at(self, start: int | None) -> None:
        _END.pack_into(self.table.memory, self.offset + _START_AT, _NO_START if start is None else start)

    def done(self) -> None:
        """The replica is done with the connection: the client sees it end now."""
        self.table.memory[self.offset] = Phase.CLOSED
        with contextlib.suppress(OSError):  # the client may have gone already
            self.sock.shutdown(socket.SHUT_RDWR)


#: ``struct tcp_info`` (Linux): ``tcpi_notsent_bytes`` (u32, 4.6) and ``tcpi_bytes_sent``,
#: ``tcpi_bytes_retrans`` (u64 each, 4.19).
_NOTSENT = struct.Struct("I")
_NOTSENT_AT = 144
_SENT_RETRANS = struct.Struct("QQ")
_SENT_AT = 200
_INFO_BYTES = _SENT_AT + _SENT_RETRANS.size


def bytes_written(sock: socket.socket) -> int | None:
    """The bytes every process that holds ``sock`` has written to the connection so far
    (what the kernel took: sent once, or still queued), read in one ``getsockopt`` that
    outlives the writer; None where the kernel does not say (not TCP, or before 4.19)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_BYTES)
    except OSError:
        return None
    if len(info) < _INFO_BYTES:
        return None
    sent, retransmitted = _SENT_RETRANS.unpack_from(info, _SENT_AT)
    notsent: int = _NOTSENT.unpack_from(info, _NOTSENT_AT)[0]
    total: int = sent - retransmitted + notsent
    return total
