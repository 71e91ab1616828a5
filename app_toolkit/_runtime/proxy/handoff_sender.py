"""The proxy's end of connection hand-off (direct ingress, docs/architecture.md): it passes
client connections to the node's ingress replicas and stays their owner of last resort.

The proxy keeps its own copy of every connection it hands over, in a slot of the
connection table it shares with that replica (``connection_table.py``), so a connection
outlives its replica. The replica records each connection's phase there with plain byte
stores, and shuts a connection down when it is done with it (closing its own descriptor
no longer ends it); the proxy learns that from the kernel (``epoll`` hang-up on its copy,
nothing read) and lets its copy go. When the replica's hand-off socket ends (the replica
died, or was killed because it hung), the proxy takes every connection back by phase:

- nothing of a request read (handed, or between requests, also when the replica died
  writing a response's end that the kernel has whole): served anew, by another replica or
  here;
- a request read but never run: ``503`` with ``Retry-After``;
- a request whose app may have run, none of its response in the kernel yet, and all
  that the connection carried before it there: ``502`` with its request id;
- a response under way: closed, so the client never takes a cut response for a whole one.

Per request this costs the replica a few byte stores and the proxy nothing; per
connection, an ``epoll_ctl`` to watch it and one to stop. Slots are bounded by the
replica's ``max_connections``; with none free, the connection is served here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import resource
import select
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from app_toolkit import metrics
from app_toolkit._runtime.answers import as_bytes, replica_lost, unavailable
from app_toolkit._runtime.connection_table import ConnectionTable, Phase, bytes_written
from app_toolkit._runtime.front.scope import new_request_id
from app_toolkit._runtime.handoff import (
    BACK,
    CONNECTION,
    NO_SLOT,
    TABLE,
    client_socket,
    is_named_listener,
    receive_messages,
    send_message,
    shown,
)

logger = logging.getLogger("app_toolkit.proxy")

#: Takes a connection the proxy has back, with nothing of a request read.
Retake = Callable[[socket.socket], None]

TAKEN_BACK = metrics.Counter(
    "app_toolkit_proxy_connections_taken_back_total",
    "Client connections the proxy took back from an ingress replica, by what became of "
    "them: given_back (the replica passed it back between requests), served_anew (its "
    "replica died between requests), answered_503 (it died before running the request), "
    "answered_502 (it died while the request may have run), closed (it died mid-response).",
    ("outcome",),
)

#: How long an answered connection may still send before it is closed (what it sends is
#: read and dropped, so closing never resets the answer away).
LINGER_S = 2.0
#: Replica paths remembered as gone (so new connections skip them until the tables do).
_GONE_MAX = 256


@dataclass(eq=False)
class _Peer:
    """One replica's hand-off socket, its connection table and the connections in it."""

    path: str
    sock: socket.socket
    table: ConnectionTable
    held: list[socket.socket | None]
    #: The descriptor each held connection is watched by (kept: a closed socket forgets it).
    fds: list[int]
    free: list[int]
    #: Slots whose connection the client ended before the replica let it go: reused once
    #: the replica records CLOSED (it may still write to them until then).
    closing: list[int] = field(default_factory=list)

    def take_slot(self) -> int | None:
        if not self.free and self.closing:
            still: list[int] = []
            for slot in self.closing:
                (self.free if self.table.phase(slot) is Phase.CLOSED else still).append(slot)
            self.closing = still
        return self.free.pop() if self.free else None


class HandoffSender:
    """The proxy's hand-off: one connection to each local replica's hand-off socket (made
    on first use), and a copy of every connection handed over. What a replica gives back
    (it is not ready, or drains) goes to ``keep`` (the proxy's own server: handing
    it on could meet the same replica again); what a replica that died leaves between
    requests goes to ``route`` (the acceptor: another local replica, or here)."""

    def __init__(self, keep: Retake, route: Retake, slots: int) -> None:
        self._keep = keep
        self._route = route
        self._slots = slots
        self._peers: dict[str, _Peer] = {}
        self._gone: collections.deque[str] = collections.deque(maxlen=_GONE_MAX)
        self._loop = asyncio.get_running_loop()
        # Only hang-ups are asked for (event mask 0): client data never wakes the proxy.
        self._hangups = select.epoll()
        self._watched: dict[int, tuple[_Peer, int]] = {}
        self._loop.add_reader(self._hangups.fileno(), self._hung_up)
        self._lingering: set[_Lingering] = set()
        _allow_descriptors()

    # ------------------------------------------------------------------ handing over

    def alive(self, path: str) -> bool:
        """False once the replica at ``path`` is known to be gone."""
        return path not in self._gone

    def send(self, path: str, connection: socket.socket) -> bool:
        """Hand ``connection`` to the replica listening at ``path``; True if it took it
        (the proxy keeps its copy: the caller must not close it)."""
        if path in self._gone:
            return False
        peer = self._peers.get(path) or self._connect(path)
        if peer is None:
            return False
        slot = peer.take_slot()
        if slot is None:  # every slot holds a connection: this one stays here
            return False
        peer.table.set_phase(slot, Phase.HANDED)
        if not send_message(peer.sock, CONNECTION, slot, connection.fileno()):
            # Its queue is full, or it is gone (its end of file is on the way).
            peer.table.set_phase(slot, Phase.FREE)
            peer.free.append(slot)
            return False
        fd = connection.fileno()
        peer.held[slot], peer.fds[slot] = connection, fd
        self._hangups.register(fd, 0)
        self._watched[fd] = (peer, slot)
        return True

    def _connect(self, path: str) -> _Peer | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.setblocking(False)
        try:
            sock.connect(path)
            if not is_named_listener(sock, path):
                logger.warning("Hand-off to %s: another process has that name now", shown(path))
                sock.close()
                return None
            table, fd = ConnectionTable.create(self._slots)
        except OSError as exc:  # the replica stopped listening (draining) or is gone
            logger.debug("Hand-off to %s: %s", shown(path), exc)
            sock.close()
            return None
        try:
            shared = send_message(sock, TABLE, self._slots, fd)
        finally:
            socket.close(fd)
        if not shared:
            table.close()
            sock.close()
            return None
        slots = self._slots
        peer = _Peer(path, sock, table, [None] * slots, [-1] * slots, list(range(slots - 1, -1, -1)))
        self._peers[path] = peer
        self._loop.add_reader(sock.fileno(), self._receive, peer)
        return peer

    # ------------------------------------------------------------------ taking back

    def _receive(self, peer: _Peer) -> None:
        messages, open_ = receive_messages(peer.sock)
        for message in messages:
            if message.kind == BACK and message.fd is None:
                connection = self._release(peer, message.slot)
                if connection is not None:
                    TAKEN_BACK.inc("given_back")
                    self._keep(connection)
            elif message.kind == CONNECTION and message.fd is not None and message.slot == NO_SLOT:
                TAKEN_BACK.inc("given_back")  # handed to it by an earlier proxy
                self._keep(client_socket(message.fd))
            elif message.fd is not None:
                socket.close(message.fd)
        if not open_:
            self._lost(peer)

    def _release(self, peer: _Peer, slot: int) -> socket.socket | None:
        """Stop watching the connection in ``slot`` and free the slot; returns our copy."""
        if not 0 <= slot < len(peer.held):
            return None
        connection, peer.held[slot] = peer.held[slot], None
        if connection is None:
            return None
        fd, peer.fds[slot] = peer.fds[slot], -1
        with contextlib.suppress(OSError):  # unregister before close: the replica's copy lives on
            self._hangups.unregister(fd)
        self._watched.pop(fd, None)
        peer.table.set_phase(slot, Phase.FREE)
        peer.free.append(slot)
        return connection

    def _hung_up(self) -> None:
        """Connections the replica shut down (or the client reset): let our copies go."""
        for fd, _events in self._hangups.poll(0):
            found = self._watched.get(fd)
            if found is None:
                continue
            peer, slot = found
            phase = peer.table.phase(slot)
            connection = self._release(peer, slot)
            if connection is not None:
                connection.close()
            if phase is not Phase.CLOSED:  # the replica still serves it: the slot waits
                peer.free.remove(slot)
                peer.closing.append(slot)

    def _lost(self, peer: _Peer) -> None:
        """The replica's hand-off socket ended: take back each connection by its phase."""
        self._drop(peer)
        self._gone.append(peer.path)
        outcomes: collections.Counter[str] = collections.Counter()
        for slot, held in enumerate(peer.held):
            if held is None:
                continue
            phase = peer.table.phase(slot)
            written = bytes_written(held) if phase in (Phase.STARTED, Phase.ENDING) else None
            if phase is Phase.ENDING:
                # It died writing a response's end, or after it, between requests (ENDING
                # stays until the next request's bytes come): whole if the kernel has it all.
                phase = Phase.IDLE if written == peer.table.end(slot) else Phase.STARTED
            if phase is Phase.STARTED and written is not None and written == peer.table.start(slot):
                # None of the response reached the kernel (the replica's loop flushes
                # writes at the end of its turn, or a WebSocket's handshake was not
                # answered yet): the client has nothing, so it is told its request may
                # have run (502) rather than cut off.
                phase = Phase.RUNNING
            request_id = peer.table.request_id(slot) if phase is Phase.RUNNING else ""
            connection = self._release(peer, slot)
            assert connection is not None
            outcome = self._settle(connection, phase, request_id)
            outcomes[outcome] += 1
            TAKEN_BACK.inc(outcome)
        peer.table.close()
        if outcomes:
            gone = "The ingress replica at %s is gone; its connections: %s"
            logger.warning(gone, shown(peer.path), dict(outcomes))

    def _settle(self, connection: socket.socket, phase: Phase, request_id: str) -> str:
        if phase in (Phase.HANDED, Phase.IDLE):
            self._route(connection)
            return "served_anew"
        if phase is Phase.HEAD:
            answer = unavailable("the replica reading this request stopped", new_request_id())
            self._answer(connection, as_bytes(answer))
            return "answered_503"
        if phase is Phase.RUNNING:
            self._answer(connection, as_bytes(replica_lost(request_id or new_request_id())))
            return "answered_502"
        with contextlib.suppress(OSError):  # mid-response, or done: the client sees the end
            connection.shutdown(socket.SHUT_RDWR)
        connection.close()
        return "closed"

    def _answer(self, connection: socket.socket, data: bytes) -> None:
        try:
            # All the connection wrote before left, so a short answer fits; one the kernel
            # took only in part is cut off by closing (its content-length tells the client).
            if connection.send(data) < len(data):
                connection.close()
                return
            connection.shutdown(socket.SHUT_WR)
        except OSError:
            connection.close()
            return
        lingering = _Lingering(connection, self._lingering.discard)
        self._lingering.add(lingering)

    # ------------------------------------------------------------------ stopping

    def _drop(self, peer: _Peer) -> None:
        if self._peers.get(peer.path) is peer:
            del self._peers[peer.path]
        with contextlib.suppress(OSError, ValueError):
            self._loop.remove_reader(peer.sock.fileno())
        peer.sock.close()

    def close(self) -> None:
        """Stop handing over; the replicas keep (and end) the connections they hold."""
        for peer in list(self._peers.values()):
            self._drop(peer)
            for slot, held in enumerate(peer.held):
                if held is not None:
                    self._release(peer, slot)
                    held.close()
            peer.table.close()
        for lingering in list(self._lingering):
            lingering.close()
        with contextlib.suppress(OSError, ValueError):
            self._loop.remove_reader(self._hangups.fileno())
        self._hangups.close()


class _Lingering:
    """A connection the proxy answered and half-closed: what the client still sends is
    read and dropped until it closes (or ``LINGER_S``), so the answer is not reset away
    by a close with unread bytes."""

    def __init__(self, connection: socket.socket, done: Callable[[_Lingering], None]) -> None:
        self._connection = connection
        self._done = done
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(connection.fileno(), self._read)
        self._timer = self._loop.call_later(LINGER_S, self.close)

    def _read(self) -> None:
        try:
            while self._connection.recv(65536):
                pass
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pass
        self.close()  # the client closed (or reset)

    def close(self) -> None:
        if self._connection.fileno() < 0:
            return
        self._timer.cancel()
        self._loop.remove_reader(self._connection.fileno())
        self._connection.close()
        self._done(self)


def _allow_descriptors() -> None:
    """The proxy holds a descriptor per handed-off connection: let it open as many as the
    system allows it (the soft limit up to the hard one)."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
