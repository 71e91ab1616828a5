"""Connection hand-off between the node's proxy and its ingress replicas (direct ingress,
docs/architecture.md): the messages both ends exchange (the proxy's end is
``proxy/handoff_sender.py``, the replica's ``replica/handoff_listener.py``).

The proxy connects to each replica's hand-off socket: a Unix ``SOCK_SEQPACKET`` socket in a
directory only their user may enter (mode 0700); the replica also checks that the peer
runs as its own user. A message is a kind byte and a slot number, with at most one file
descriptor attached (``socket.send_fds``):

- ``TABLE`` (proxy → replica, first): the shared connection table (a ``memfd``) and its
  number of slots (``connection_table.py``);
- ``CONNECTION``: a client connection in a slot (proxy → replica); from a replica, a
  connection given back whose slot the proxy does not know (``NO_SLOT``: one handed over
  by an earlier proxy), which the proxy then serves as a new one;
- ``BACK`` (replica → proxy, no descriptor): the connection in this slot is the proxy's
  again, nothing of a request read (a replica not ready, or draining).

A send that cannot go out at once fails: the caller then serves the connection itself,
so nothing waits on a slow peer.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

TABLE = b"t"
CONNECTION = b"c"
BACK = b"b"
#: The slot of a connection given back without one.
NO_SLOT = 0xFFFFFFFF
_MESSAGE = struct.Struct("!cI")  # kind, slot (or the table's number of slots)
_RECEIVE_MAX = 64  # messages read in one wake-up, so one busy peer cannot hold the loop


@dataclass(frozen=True, slots=True)
class Message:
    """One hand-off message; ``fd`` is the descriptor that came with it (now ours)."""

    kind: bytes
    slot: int
    fd: int | None = None


def send_message(peer: socket.socket, kind: bytes, slot: int, fd: int | None = None) -> bool:
    """Send one message without waiting; True if it went. False: the peer is gone or its
    queue is full (the caller keeps what it would have passed)."""
    data = _MESSAGE.pack(kind, slot)
    try:
        sent = socket.send_fds(peer, [data], [fd]) if fd is not None else peer.send(data)
    except OSError:  # BlockingIOError (full), BrokenPipeError, ConnectionRefusedError ...
        return False
    return sent == len(data)


def receive_messages(peer: socket.socket) -> tuple[list[Message], bool]:
    """The messages waiting on ``peer`` (non-blocking), and whether the peer is still
    open. A message of another shape is dropped (its descriptor closed)."""
    received: list[Message] = []
    for _ in range(_RECEIVE_MAX):
        try:
            data, fds, _flags, _address = socket.recv_fds(peer, _MESSAGE.size, 1)
        except (BlockingIOError, InterruptedError):
            return received, True
        except OSError:
            return received, False
        if not data and not fds:
            return received, False  # the peer closed its end
        if len(data) != _MESSAGE.size or len(fds) > 1:
            for fd in fds:
                socket.close(fd)
            continue
        kind, slot = _MESSAGE.unpack(data)
        received.append(Message(kind, slot, fds[0] if fds else None))
    return received, True


def client_socket(fd: int) -> socket.socket:
    """A received client connection's descriptor as a non-blocking socket."""
    connection = socket.socket(fileno=fd)
    connection.setblocking(False)
    return connection
