"""Connection hand-off between the node's proxy and its ingress replicas (direct ingress,
docs/architecture.md): the messages both ends exchange (the proxy's end is
``proxy/handoff_sender.py``, the replica's ``direct_ingress/handoff_listener.py``).

The proxy connects to each replica's hand-off socket: a Unix ``SOCK_SEQPACKET`` socket with
an abstract name (Linux; no file, so a replica killed with SIGKILL leaves nothing behind).
Any process on the host may connect to an abstract name, or bind one that was freed, so
each end checks the other (``SO_PEERCRED``): the replica listens only to a proxy of its
own user, and the proxy passes nothing to a listener that is not of its user and not the
process the name was made by. A message is a kind byte and a slot number, with at most one file
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

import os
import secrets
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
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_NAME_PREFIX = "\0app-toolkit-handoff-"


def socket_name() -> str:
    """A new abstract name for this process's hand-off socket (its pid is in it)."""
    return f"{_NAME_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"


def shown(name: str) -> str:
    """``name`` as ``ss`` shows an abstract name (``@`` for the leading NUL), for logs."""
    return "@" + name[1:] if name.startswith("\0") else name


def peer_credentials(peer: socket.socket) -> tuple[int, int]:
    """The process id and user id of the process at the other end of ``peer``."""
    pid, uid, _gid = _CREDENTIALS.unpack(
        peer.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    )
    return pid, uid


def is_named_listener(peer: socket.socket, name: str) -> bool:
    """True if the listener ``peer`` reached by ``name`` runs as our user and is the
    process that made the name (not another that bound it after that one let it go)."""
    pid, uid = peer_credentials(peer)
    made_by = name.removeprefix(_NAME_PREFIX).partition("-")[0]
    return uid == os.getuid() and made_by == str(pid)


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
