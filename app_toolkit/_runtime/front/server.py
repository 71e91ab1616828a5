"""The proxy's listening socket and uvicorn server (both backends use this), and an
ingress replica's own server for the connections the proxy hands it (direct ingress).

Proxies on several Ray nodes of one machine (a laptop "cluster", or several raylets on a
big host) share one port: their sockets set ``SO_REUSEPORT`` and the kernel spreads new
connections across them. Only sockets of the same user with the option set can join, so
a foreign server on the port still makes the bind fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import uvicorn
from starlette.types import ASGIApp

from app_toolkit._runtime.connection_table import Handed
from app_toolkit._runtime.front import uvicorn_compat
from app_toolkit._runtime.front.http_guard import GuardedHttpProtocol, guarded_protocol
from app_toolkit._runtime.front.https import ServedTLS
from app_toolkit.config import HTTPOptions

logger = logging.getLogger("app_toolkit.proxy")

#: At stop, how long connections accepted last get to be read before the shutdown.
_SETTLE_S = 0.05
#: How long a server whose listener could not be made gets to stop before it is cancelled.
_STOP_FAILED_S = 5.0


def _port_error(host: str, port: int, exc: OSError) -> OSError:
    return OSError(
        f"The proxy could not listen on {host}:{port} ({exc.strerror or exc}); is "
        "the port in use? Pick another with --port (or http_options={'port': ...})."
    )


def listen_socket(host: str, port: int, *, exclusive: bool) -> socket.socket:
    """A bound TCP socket that other proxies may join (``SO_REUSEPORT``).

    ``exclusive``: first make sure nobody listens on the port yet; the first proxy of a
    fresh toolkit checks this so that a forgotten earlier run is reported, not joined.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except OSError as exc:
        raise OSError(
            f"The proxy cannot listen on host {host!r} ({exc.strerror or exc}); use an "
            "IP address of this machine, 0.0.0.0 for all of them, or a name it resolves."
        ) from None
    if exclusive and port != 0:
        probe = socket.socket(family, kind, proto)
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
        except OSError as exc:
            raise _port_error(host, port, exc) from None
        finally:
            probe.close()
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise _port_error(host, port, exc) from None
    return sock


class Adopter:
    """Serves connections accepted elsewhere (by our acceptor, or handed over by the
    proxy) with the server's protocol, as if its own listener had accepted them."""

    def __init__(self, server: uvicorn.Server) -> None:
        self._server = server
        self._tasks: set[asyncio.Task[object]] = set()
        self.closed = False

    def __call__(self, connection: socket.socket, handed: Handed | None = None) -> None:
        """Serve ``connection``; ``handed``: the proxy keeps a copy (direct ingress)."""
        if self.closed:
            self._let_go(connection, handed)
            return
        server, loop = self._server, asyncio.get_running_loop()
        config = server.config

        def protocol() -> asyncio.BaseProtocol:
            made = config.http_protocol_class(  # type: ignore[call-arg] # uvicorn's own call
                config=config, server_state=server.server_state, app_state=server.lifespan.state
            )
            if handed is None:
                return made
            assert isinstance(made, GuardedHttpProtocol)  # serve() sets it
            return made.handed_reads(handed)

        task = loop.create_task(loop.connect_accepted_socket(protocol, connection))
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._settled(done, connection, handed))

    def _settled(self, task: asyncio.Task[object], connection: socket.socket, handed: Handed | None) -> None:
        self._tasks.discard(task)
        if task.cancelled():  # the server stopped before the connection was set up
            self._let_go(connection, handed)
        elif task.exception() is not None:
            logger.warning("Could not serve an accepted connection: %s", task.exception())
            self._let_go(connection, handed)

    @staticmethod
    def _let_go(connection: socket.socket, handed: Handed | None) -> None:
        if handed is not None:
            handed.done()  # ends it for the proxy's copy too
        connection.close()

    def close(self) -> None:
        self.closed = True
        for task in self._tasks:
            task.cancel()


class Listener(Protocol):
    """Our own listener in front of the server, where uvicorn does not listen itself (the
    node's proxy under direct ingress: ``proxy/acceptor.py``'s ``DirectListener``)."""

    def close(self) -> None:
        """Stop accepting connections (the ones taken are served on)."""
        ...

    def stopped(self) -> None:
        """The server has stopped: let go of what the listener keeps."""
        ...


#: Makes the :class:`Listener` on a listening socket, its connections served by ``adopt``.
MakeListener = Callable[[socket.socket, Adopter], Listener]


@dataclass
class ProxyServer:
    """A running uvicorn server for the proxy app (or an ingress replica's front)."""

    server: uvicorn.Server
    task: asyncio.Task[None]
    port: int
    on_stop: Callable[[], None] | None = None
    on_stopped: Callable[[], None] | None = None
    #: Serves a connection accepted elsewhere (see :class:`Adopter`).
    adopt: Adopter = field(init=False)
    #: The listener when it is ours (direct ingress): it hands connections off.
    listener: Listener | None = None

    def __post_init__(self) -> None:
        self.adopt = Adopter(self.server)

    def connections(self) -> list[GuardedHttpProtocol]:
        """The HTTP connections open now (WebSocket ones are not listed)."""
        return [c for c in self.server.server_state.connections if isinstance(c, GuardedHttpProtocol)]

    async def stop(self, timeout_s: float) -> None:
        """Stop accepting connections and finish open ones (bounded)."""
        if self.listener is not None:
            self.listener.close()
            # The connections it took last deliver their first request before the server's
            # shutdown closes the connections that carry none (as idle).
            await asyncio.sleep(_SETTLE_S)
        self.server.should_exit = True
        if self.on_stop is not None:
            self.on_stop()
        await asyncio.wait({self.task}, timeout=timeout_s)
        self.adopt.close()
        if self.listener is not None:
            self.listener.stopped()
        if self.on_stopped is not None:
            self.on_stopped()


def uvicorn_config(app: ASGIApp, http: HTTPOptions) -> uvicorn.Config:
    """How uvicorn serves ``app`` for the toolkit: our guarded protocol, the options'
    limits, no logging of its own (the front writes the access lines)."""
    return uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        access_log=False,
        http=guarded_protocol(http),
        ws=uvicorn_compat.WebSocketProtocol,
        timeout_keep_alive=http.keep_alive_timeout_s,
        ws_max_size=http.websocket_max_message_bytes,
        root_path=http.root_path,
        proxy_headers=http.proxy_headers,
        forwarded_allow_ips=http.forwarded_allow_ips,
    )


async def serve(
    app: ASGIApp,
    http: HTTPOptions,
    sock: socket.socket | None,
    on_stop: Callable[[], None] | None = None,
    on_stopped: Callable[[], None] | None = None,
    listen: MakeListener | None = None,
) -> ProxyServer:
    """Serve ``app`` on ``sock`` under uvicorn; returns once it accepts connections. The
    server owns ``sock`` from here (closed if it cannot start). ``on_stop`` runs when the
    server is told to stop (to end streams the app keeps open itself), ``on_stopped``
    once it has stopped (or the wait for it ran out).

    With ``listen`` (direct ingress), our own listener takes ``sock``'s connections (and
    hands them to local ingress replicas); without ``sock``, the server serves only the
    connections given to its ``adopt`` (an ingress replica's front). With HTTPS in the
    options, a server listening itself serves TLS (``https.py``)."""
    config = uvicorn_config(app, http)
    server = uvicorn.Server(config)
    uvicorn_listens = sock is not None and listen is None
    tls = http.client_tls
    if tls is not None and uvicorn_listens:
        config.load()  # (uvicorn would; its context is then ours, kept current with the files)
        try:
            config.ssl = ServedTLS(tls).context
        except BaseException:  # (the files are not on this node, say): the socket goes
            if sock is not None:
                sock.close()
            raise
    sockets = [sock] if uvicorn_listens and sock is not None else []
    task = asyncio.get_running_loop().create_task(server.serve(sockets=sockets))
    try:
        while not server.started:
            if task.done():
                task.result()  # raises what stopped it
                raise OSError(f"The proxy server stopped while starting on {http.host}:{http.port}")
            await asyncio.sleep(0.01)
    except BaseException:
        task.cancel()
        if sock is not None:
            sock.close()
        raise
    port = int(sock.getsockname()[1]) if sock is not None else 0
    running = ProxyServer(server, task, port, on_stop, on_stopped)
    if sock is not None and listen is not None:
        try:
            sock.listen(config.backlog)  # uvicorn's backlog, as its own listener would use
            running.listener = listen(sock, running.adopt)
        except BaseException:  # no listener: the server stops and lets the socket go
            server.should_exit = True
            try:
                await asyncio.wait({task}, timeout=_STOP_FAILED_S)
            finally:
                task.cancel()
                sock.close()
                with contextlib.suppress(BaseException):  # its own end is not this failure
                    await task
            raise
    return running
