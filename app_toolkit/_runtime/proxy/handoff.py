"""Connection hand-off (direct ingress, docs/architecture.md): the node's proxy passes an
accepted client connection to an ingress replica on the same node, which then serves it
in its own process; a draining replica passes its idle connections back.

The proxy connects to each replica's hand-off socket: a Unix ``SOCK_SEQPACKET`` socket in a
directory only their user may enter (mode 0700); the replica also checks that the peer
runs as its own user. Each message is one byte with one file descriptor attached
(``socket.send_fds``). A send that cannot go out at once fails: the caller then serves
the connection itself, so nothing waits on a slow peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import struct
import tempfile
from collections.abc import Callable
from urllib.parse import unquote

logger = logging.getLogger("app_toolkit.proxy")

#: A connection handed over (proxy → replica) and handed back (replica → proxy).
_CONNECTION = b"c"
_RECEIVE_MAX = 64  # messages read in one wake-up, so one busy peer cannot hold the loop
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid

#: Takes a connected client socket and serves it.
Adopt = Callable[[socket.socket], None]


def request_target(head: bytes) -> str | None:
    """The decoded path of the HTTP/1 request line at the start of ``head``, or None when
    ``head`` holds no whole request line (the proxy then serves the connection itself)."""
    end = head.find(b"\n")
    if end < 0:
        return None
    parts = head[:end].rstrip(b"\r").split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return None
    target = parts[1].split(b"?", 1)[0]
    if not target.startswith(b"/"):  # absolute form (http://host/path) or '*'
        scheme_end = target.find(b"://")
        if scheme_end < 0:
            return None
        slash = target.find(b"/", scheme_end + 3)
        target = target[slash:] if slash >= 0 else b"/"
    return unquote(target.decode("latin-1"))


def send_connection(peer: socket.socket, connection: socket.socket) -> bool:
    """Pass ``connection`` to ``peer`` without waiting; True if it went (the caller then
    closes its own copy). False: the peer is gone or its queue is full."""
    try:
        return socket.send_fds(peer, [_CONNECTION], [connection.fileno()]) == 1
    except OSError:  # BlockingIOError (full), BrokenPipeError, ConnectionRefusedError ...
        return False


def receive_connections(peer: socket.socket) -> tuple[list[socket.socket], bool]:
    """The connections waiting on ``peer`` (non-blocking), and whether the peer is still
    open. A message without a descriptor is ignored."""
    received: list[socket.socket] = []
    for _ in range(_RECEIVE_MAX):
        try:
            data, fds, _flags, _address = socket.recv_fds(peer, 1, 1)
        except (BlockingIOError, InterruptedError):
            return received, True
        except OSError:
            return received, False
        if not data and not fds:
            return received, False  # the peer closed its end
        for fd in fds:
            connection = socket.socket(fileno=fd)
            connection.setblocking(False)
            received.append(connection)
    return received, True


class HandoffListener:
    """A replica's hand-off socket: adopts the connections the node's proxy passes, and
    passes idle ones back (``give_back``) when the replica drains."""

    def __init__(self, adopt: Adopt, ready: Callable[[], bool] = lambda: True) -> None:
        self._adopt = adopt
        #: The replica can serve what it is handed (its front has its routes); until then
        #: connections go straight back.
        self._ready = ready
        self._directory = ""
        self._listener: socket.socket | None = None
        self._peers: list[socket.socket] = []
        self.path = ""
        #: Set when the replica drains: connections that still arrive go straight back.
        self.draining = False

    def start(self) -> str:
        """Listen (on the running loop); returns the socket's path for the proxy."""
        self._directory = tempfile.mkdtemp(prefix="app-toolkit-")  # mode 0700
        self.path = os.path.join(self._directory, "handoff")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            listener.bind(self.path)
            listener.listen(16)
            listener.setblocking(False)
        except OSError:
            listener.close()
            shutil.rmtree(self._directory, ignore_errors=True)
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
            pid, uid, _gid = _CREDENTIALS.unpack(
                peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
            )
            if uid != os.getuid():
                logger.warning("Hand-off socket: refused process %d of user %d", pid, uid)
                peer.close()
                continue
            peer.setblocking(False)
            self._peers.append(peer)
            loop.add_reader(peer.fileno(), self._receive, peer)

    def _receive(self, peer: socket.socket) -> None:
        connections, open_ = receive_connections(peer)
        for connection in connections:
            # A draining replica, or one not ready yet, sends what arrives straight back.
            if (self.draining or not self._ready()) and send_connection(peer, connection):
                connection.close()
            else:
                self._adopt(connection)
        if not open_:
            self._drop(peer)

    def _drop(self, peer: socket.socket) -> None:
        with contextlib.suppress(ValueError):
            self._peers.remove(peer)
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
        shutil.rmtree(self._directory, ignore_errors=True)

    def give_back(self, connection: socket.socket) -> bool:
        """Pass a client connection back to the proxy; True if one took it (the caller
        then closes its own copy)."""
        return any(send_connection(peer, connection) for peer in self._peers)

    def close(self) -> None:
        self.stop_listening()
        for peer in list(self._peers):
            self._drop(peer)


class HandoffSender:
    """The proxy's side: one connection to each local replica's hand-off socket (made on
    first use), and the connections replicas give back, served by ``adopt``."""

    def __init__(self, adopt: Adopt) -> None:
        self._adopt = adopt
        self._peers: dict[str, socket.socket] = {}

    def send(self, path: str, connection: socket.socket) -> bool:
        """Hand ``connection`` to the replica listening at ``path``; True if it took it."""
        peer = self._peers.get(path)
        if peer is None:
            peer = self._connect(path)
            if peer is None:
                return False
        try:
            return socket.send_fds(peer, [_CONNECTION], [connection.fileno()]) == 1
        except (BlockingIOError, InterruptedError):
            return False  # its queue is full: this connection stays here
        except OSError as exc:  # the replica is gone
            logger.debug("Hand-off to %s: %s", path, exc)
            self._drop(path)
            return False

    def _connect(self, path: str) -> socket.socket | None:
        peer = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        peer.setblocking(False)
        try:
            peer.connect(path)
        except OSError as exc:  # the replica stopped listening (draining) or is gone
            logger.debug("Hand-off to %s: %s", path, exc)
            peer.close()
            return None
        self._peers[path] = peer
        asyncio.get_running_loop().add_reader(peer.fileno(), self._receive, path)
        return peer

    def _receive(self, path: str) -> None:
        peer = self._peers.get(path)
        if peer is None:
            return
        connections, open_ = receive_connections(peer)
        for connection in connections:
            self._adopt(connection)  # given back by a draining replica
        if not open_:
            self._drop(path)

    def _drop(self, path: str) -> None:
        peer = self._peers.pop(path, None)
        if peer is not None:
            asyncio.get_running_loop().remove_reader(peer.fileno())
            peer.close()

    def keep(self, paths: set[str]) -> None:
        """Forget the replicas not in ``paths`` (they left the tables)."""
        for path in [path for path in self._peers if path not in paths]:
            self._drop(path)

    def close(self) -> None:
        for path in list(self._peers):
            self._drop(path)
