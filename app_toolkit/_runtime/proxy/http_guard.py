"""The proxy's HTTP/1.1 connections, guarded against slow and oversized clients.

uvicorn's httptools protocol parses requests; this subclass adds what a server on the open
internet needs and uvicorn leaves out (docs/security.md):

- a request head (request line and headers) larger than ``max_header_bytes`` gets 431;
- a head that has not fully arrived ``header_timeout_s`` after its first byte gets 408
  (slowloris), and a connection that sends nothing is closed after the keep-alive timeout;
- beyond ``max_connections`` open connections, a new one is answered 503 with
  ``Retry-After`` and closed before anything of it is read.

Request bodies are bounded by the proxy itself (``proxy.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app_toolkit.config import HTTPOptions

logger = logging.getLogger("app_toolkit.proxy")

#: The scope key of a request's :class:`DisconnectHook` (set by this protocol).
DISCONNECT_HOOK = "app_toolkit.disconnect_hook"


class DisconnectHook:
    """Lets the app learn at once that the client went away before its response was
    complete, without a task per request waiting on ``receive()`` for the
    ``http.disconnect`` message: the protocol calls ``callback`` from ``connection_lost``."""

    __slots__ = ("callback",)

    def __init__(self) -> None:
        self.callback: Callable[[], None] | None = None


_REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}


def _refusal(status: int, text: str, retry_after_s: int | None = None) -> bytes:
    body = text.encode()
    lines = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        "content-type: text/plain; charset=utf-8",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    if retry_after_s is not None:
        lines.append(f"retry-after: {retry_after_s}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with limits; see :func:`guarded_protocol`."""

    options: HTTPOptions  # set on the subclass guarded_protocol() makes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes: int | None = None  # bytes of the request head so far; None: not in one
        self._head_timer: asyncio.TimerHandle | None = None
        self._hook: DisconnectHook | None = None  # of the latest request (uvicorn's self.cycle)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limit = self.options.max_connections
        if len(self.connections) > limit:
            logger.warning("Refusing a connection: %d are open (max_connections)", limit)
            transport.write(_refusal(503, "Too many connections; try again shortly.\n", retry_after_s=1))
            transport.close()
            return
        # A connection that never sends a byte is closed like an idle keep-alive one.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        cycle, hook = self.cycle, self._hook
        super().connection_lost(exc)
        if hook is not None and hook.callback is not None and cycle is not None and cycle.disconnected:
            hook.callback()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_bytes is None or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > self.options.max_header_bytes:
            self._refuse(
                431,
                f"Request line and headers exceed {self.options.max_header_bytes} bytes (max_header_bytes).",
            )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._stop_head_timer()
        self._head_timer = self.loop.call_later(self.options.header_timeout_s, self._head_too_slow)

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        self._stop_head_timer()
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.scope is self.scope:  # an HTTP request (no upgrade)
            self._hook = self.scope[DISCONNECT_HOOK] = DisconnectHook()  # type: ignore[literal-required]

    def _head_too_slow(self) -> None:
        self._head_timer = None
        self._refuse(
            408, f"Headers did not arrive within {self.options.header_timeout_s} s (header_timeout_s)."
        )

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _refuse(self, status: int, text: str) -> None:
        self._head_bytes = None
        self._stop_head_timer()
        if self.transport.is_closing():
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "-"
        logger.info("%s: %d, closing the connection (%s)", client, status, text)
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(_refusal(status, text + "\n"))
            self.transport.close()
        else:  # a response is on its way: it finishes, then the connection closes
            self.cycle.keep_alive = False
            self.flow.pause_reading()


def guarded_protocol(options: HTTPOptions) -> type[GuardedHttpProtocol]:
    """The protocol class uvicorn should use for a proxy with ``options``."""
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"options": options})
