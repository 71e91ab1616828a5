"""An ingress replica's hand-off socket (direct ingress): it adopts the client connections
the node's proxy passes, records where each stands in the table it shares with that
proxy, and passes connections back when it is not ready or drains. The messages are
``handoff.py``'s; the proxy's end is ``proxy/handoff_sender.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable

from app_toolkit._runtime.connection_table import ConnectionTable, Handed, Phase
from app_toolkit._runtime.handoff import (
    BACK,
    CONNECTION,
    NO_SLOT,
    TABLE,
    client_socket,
    peer_credentials,
    receive_messages,
    send_message,
    socket_name,
)

logger = logging.getLogger("app_toolkit.replica")

#: Serves a connection: the socket, and what the proxy keeps of it (None: nothing).
Adopt = Callable[[socket.socket, Handed | None], None]


class HandoffListener:
    """A replica's hand-off socket: adopts the connections the node's proxy passes, and
    passes connections back (``give_back``) when the replica drains."""

    def __init__(self, adopt: Adopt, ready: Callable[[], bool] = lambda: True) -> None:
        self._adopt = adopt
        #: The replica can serve what it is handed (its front has its routes); until then
        #: connections go straight back.
        self._ready = ready
        self._listener: socket.socket | None = None
        #: Each proxy connected to us, with the connection table it shared (once it has).
        self._peers: dict[socket.socket, ConnectionTable | None] = {}
        self.path = ""
        #: Set when the replica drains: connections that still arrive go straight back.
        self.draining = False

    def start(self) -> str:
        """Listen (on the running loop); returns the socket's path for the proxy."""
        self.path = socket_name()  # abstract: nothing left behind (handoff.py)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            listener.bind(self.path)
            listener.listen(16)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        asyncio.get_running_loop().add_reader(listener.fileno(), self._accept)
        return self.path

    def _accept(self) -> None:
        assert self._listener is not None
        loop = asyncio.get_running_loop()
        while True:
            try:
                peer, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                logger.warning("Hand-off socket: accept failed: %s", exc)
                return
            pid, uid = peer_credentials(peer)
            if uid != os.getuid():
                logger.warning("Hand-off socket: refused process %d of user %d", pid, uid)
                peer.close()
                continue
            peer.setblocking(False)
            self._peers[peer] = None
            loop.add_reader(peer.fileno(), self._receive, peer)

    def _receive(self, peer: socket.socket) -> None:
        messages, open_ = receive_messages(peer)
        for message in messages:
            if message.fd is None:
                continue
            if message.kind == TABLE:
                try:
                    self._peers[peer] = ConnectionTable.attach(message.fd, message.slot)
                except (OSError, ValueError) as exc:
                    logger.warning("Hand-off socket: the proxy's connection table is unusable: %s", exc)
            elif message.kind == CONNECTION:
                self._take(peer, message.slot, client_socket(message.fd))
            else:
                os.close(message.fd)
        if not open_:
            self._drop(peer)

    def _take(self, peer: socket.socket, slot: int, connection: socket.socket) -> None:
        table = self._peers.get(peer)
        handed = None
        if table is not None and slot < table.slots:
            handed = Handed(peer, table, slot, ConnectionTable.offset(slot), connection)
        # A draining replica, or one not ready yet, sends what arrives straight back.
        if (self.draining or not self._ready()) and self.give_back(connection, handed):
            connection.close()
            return
        self._adopt(connection, handed)

    def _drop(self, peer: socket.socket) -> None:
        # Its table stays mapped while connections it handed over still record into it.
        self._peers.pop(peer, None)
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(peer.fileno())
        peer.close()

    def stop_listening(self) -> None:
        """Take no more connections (the replica drains): the proxy serves new ones, and
        what it still sends before it sees the new tables comes straight back."""
        self.draining = True
        if self._listener is not None:
            asyncio.get_running_loop().remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None

    def give_back(self, connection: socket.socket, handed: Handed | None) -> bool:
        """Pass a client connection with nothing of a request read back to the proxy;
        True if one took it (the caller then lets its own copy go without shutting the
        connection down). The proxy that keeps a copy is told its slot; another (the one
        after a proxy restart) gets the connection itself."""
        if handed is not None and handed.peer in self._peers:
            handed.record(Phase.IDLE)
            return send_message(handed.peer, BACK, handed.slot)
        fd = connection.fileno()
        return any(send_message(peer, CONNECTION, NO_SLOT, fd) for peer in self._peers)

    def close(self) -> None:
        self.stop_listening()
        for peer in list(self._peers):
            self._drop(peer)
