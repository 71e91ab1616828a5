"""The proxy's listening socket and uvicorn server (both backends use this).

Proxies on several Ray nodes of one machine (a laptop "cluster", or several raylets on a
big host) share one port: their sockets set ``SO_REUSEPORT`` and the kernel spreads new
connections across them. Only sockets of the same user with the option set can join, so
a foreign server on the port still makes the bind fail.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn
from starlette.types import ASGIApp

from app_toolkit._runtime.proxy.http_guard import guarded_protocol
from app_toolkit.config import HTTPOptions


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


@dataclass
class ProxyServer:
    """A running uvicorn server for the proxy app."""

    server: uvicorn.Server
    task: asyncio.Task[None]
    port: int
    on_stop: Callable[[], None] | None = None
    on_stopped: Callable[[], None] | None = None

    async def stop(self, timeout_s: float) -> None:
        """Stop accepting connections and finish open ones (bounded)."""
        self.server.should_exit = True
        if self.on_stop is not None:
            self.on_stop()
        await asyncio.wait({self.task}, timeout=timeout_s)
        if self.on_stopped is not None:
            self.on_stopped()


async def serve(
    app: ASGIApp,
    http: HTTPOptions,
    sock: socket.socket,
    on_stop: Callable[[], None] | None = None,
    on_stopped: Callable[[], None] | None = None,
) -> ProxyServer:
    """Serve ``app`` on ``sock`` under uvicorn; returns once it accepts connections. The
    server owns ``sock`` from here (closed if it cannot start). ``on_stop`` runs when the
    server is told to stop (to end streams the app keeps open itself), ``on_stopped``
    once it has stopped (or the wait for it ran out)."""
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        access_log=False,
        http=guarded_protocol(http),
        timeout_keep_alive=http.keep_alive_timeout_s,
        ws_max_size=http.websocket_max_message_bytes,
        root_path=http.root_path,
        proxy_headers=http.proxy_headers,
        forwarded_allow_ips=http.forwarded_allow_ips,
    )
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # raises what stopped it
                raise OSError(f"The proxy server stopped while starting on {http.host}:{http.port}")
            await asyncio.sleep(0.01)
    except BaseException:
        task.cancel()
        sock.close()
        raise
    return ProxyServer(server, task, int(sock.getsockname()[1]), on_stop, on_stopped)
