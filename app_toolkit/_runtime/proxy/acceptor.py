"""The proxy's listening socket under direct ingress: each accepted connection goes to a
local ingress replica of the application its first request is for, or is served here.

The first request line is read without being consumed (``MSG_PEEK``), so the replica
parses the request as if it had accepted the connection itself. A connection is served
by the proxy when no local ingress replica of its application exists, when its request
line did not arrive whole in the first segment, when API keys are on and its first
request's head (whole in the first segment) presents no valid key, or when the hand-off
fails.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Protocol
from urllib.parse import unquote

from app_toolkit import metrics
from app_toolkit._runtime.proxy.handoff_sender import HandoffSender

logger = logging.getLogger("app_toolkit.proxy")

_PEEK_BYTES = 4096  # enough for any request line the proxy would route
_ACCEPT_MAX = 64  # connections accepted in one wake-up, so the loop keeps serving

#: Serves a connection in the proxy's own server.
Adopt = Callable[[socket.socket], None]

HANDED_OFF = metrics.Counter(
    "app_toolkit_proxy_connections_handed_off_total",
    "Client connections the proxy passed to a local ingress replica (direct ingress).",
    ("application",),
)
SERVED_HERE = metrics.Counter(
    "app_toolkit_proxy_connections_served_total",
    "Client connections the proxy served itself, by why: no_replica (no local ingress "
    "replica of the application), unrouted (no whole request line to route by), "
    "refused (the replica did not take it), no_key (API keys are on and the first request's "
    "head, whole in its first bytes, presents no valid key), stopping (accepted as the proxy "
    "stopped handing off, before its first bytes came).",
    ("why",),
)


class HandoffRoutes(Protocol):
    """Where connections go: the hand-off socket of a local ingress replica."""

    def wanted(self) -> bool:
        """Some application has an ingress replica on this node (else nothing is peeked)."""
        ...

    def choose(self, path: str) -> tuple[str, str] | None:
        """The application and hand-off socket path for a first request to ``path``."""
        ...

    def opens(self, head: bytes) -> bool:
        """The request head at the start of ``head`` may go to a replica: API keys are off,
        or it presents a valid one (else the proxy answers it: no key reaches a replica)."""
        ...


class Acceptor:
    """Accepts on ``listener`` and hands off or serves (``adopt``) each connection."""

    def __init__(
        self,
        listener: socket.socket,
        adopt: Adopt,
        routes: HandoffRoutes,
        sender: HandoffSender,
        wait_s: float,
        max_waiting: int,
    ) -> None:
        self._listener = listener
        self._adopt = adopt
        self._routes = routes
        self._sender = sender
        self._wait_s = wait_s  # a connection that sends nothing for this long is closed
        self._max_waiting = max_waiting
        #: Connections whose first bytes have not arrived yet, with their timers.
        self._waiting: dict[socket.socket, asyncio.TimerHandle] = {}
        #: Connections handed to local replicas, and served here (for stats and tests).
        self.handed = 0
        self.served = 0
        self._loop = asyncio.get_running_loop()

    def start(self) -> None:
        self._listener.setblocking(False)
        self._loop.add_reader(self._listener.fileno(), self._accept)

    def close(self) -> None:
        """Stop accepting. Those the kernel had accepted already are taken first: closing a
        listener resets its queue, and other servers on the port (``SO_REUSEPORT``) take
        new ones. Connections still waiting for their first bytes go to the proxy's own
        server, which serves a first request that arrives while it stops (and closes the
        others as idle ones)."""
        if self._listener.fileno() >= 0:
            self._loop.remove_reader(self._listener.fileno())
            while self._accept():
                pass
            self._listener.close()
        for connection in list(self._waiting):
            self._forget(connection)
            self._keep(connection, "stopping")

    def _accept(self) -> bool:
        """Accept up to ``_ACCEPT_MAX`` connections; True if more may be waiting."""
        for _ in range(_ACCEPT_MAX):
            try:
                connection, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as exc:  # e.g. out of file descriptors: try again on the next wake-up
                logger.warning("Accepting a connection failed: %s", exc)
                return False
            try:
                connection.setblocking(False)
                connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # reset before we got to it
                connection.close()
                continue
            self.take(connection)
        return True

    def take(self, connection: socket.socket) -> None:
        """Route a connection with nothing of a request read: a new one, or one the proxy
        took back from a replica (given back, or left by a replica that died)."""
        if not self._wanted() or len(self._waiting) >= self._max_waiting:
            self._keep(connection, "no_replica")
        else:
            self._peek(connection)

    def _wanted(self) -> bool:
        try:
            return self._routes.wanted()
        except Exception:  # a routing hook must never stop the proxy accepting
            logger.exception("Choosing where connections go failed; serving them here")
            return False

    def _peek(self, connection: socket.socket) -> None:
        try:
            head = connection.recv(_PEEK_BYTES, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            if connection not in self._waiting:  # wait for the first bytes
                self._loop.add_reader(connection.fileno(), self._readable, connection)
                self._waiting[connection] = self._loop.call_later(self._wait_s, self._too_quiet, connection)
            return
        except OSError:
            self._forget(connection)
            connection.close()
            return
        self._forget(connection)
        if not head:  # the client closed before sending anything
            connection.close()
            return
        self._route(connection, head)

    def _readable(self, connection: socket.socket) -> None:
        self._peek(connection)

    def _too_quiet(self, connection: socket.socket) -> None:
        self._waiting.pop(connection, None)
        self._loop.remove_reader(connection.fileno())
        connection.close()  # as an idle keep-alive connection would be

    def _forget(self, connection: socket.socket) -> None:
        timer = self._waiting.pop(connection, None)
        if timer is not None:
            timer.cancel()
            self._loop.remove_reader(connection.fileno())

    def _route(self, connection: socket.socket, head: bytes) -> None:
        path = request_target(head)
        if path is None:
            self._keep(connection, "unrouted")
            return
        if not self._routes.opens(head):
            self._keep(connection, "no_key")
            return
        try:
            target = self._routes.choose(path)
        except Exception:  # a routing hook must never lose a connection
            logger.exception("Choosing a replica for %s failed; serving it here", path)
            target = None
        if target is None:
            self._keep(connection, "no_replica")
            return
        app, handoff = target
        if self._sender.send(handoff, connection):  # the sender keeps our copy
            self.handed += 1
            HANDED_OFF.inc(app)
        else:
            self._keep(connection, "refused")

    def _keep(self, connection: socket.socket, why: str) -> None:
        self.served += 1
        SERVED_HERE.inc(why)
        self._adopt(connection)


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


class DirectListener:
    """The node's proxy's listener under direct ingress (a ``server.Listener``): its
    acceptor, and the sender that hands connections to local ingress replicas and takes
    back the ones they return (``adopt``: served by the proxy's own server)."""

    def __init__(
        self, listener: socket.socket, adopt: Adopt, routes: HandoffRoutes, keep_alive_s: float, limit: int
    ) -> None:
        self.sender = HandoffSender(adopt, self._route, limit)
        self.acceptor = Acceptor(listener, adopt, routes, self.sender, keep_alive_s, limit)
        self.acceptor.start()

    def _route(self, connection: socket.socket) -> None:
        """A connection a replica gave back, with a next request to route."""
        self.acceptor.take(connection)

    def close(self) -> None:
        self.acceptor.close()

    def stopped(self) -> None:
        self.sender.close()
