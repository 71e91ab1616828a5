"""The proxy's HTTP/1.1 connections, guarded against slow and oversized clients.

uvicorn's httptools protocol parses requests; this subclass adds what a server on the open
internet needs and uvicorn leaves out (docs/security.md):

- a request head (request line and headers) larger than ``max_header_bytes`` gets 431;
- a head that has not fully arrived ``header_timeout_s`` after its first byte gets 408
  (slowloris), and a connection that sends nothing is closed after the keep-alive timeout;
- beyond ``max_connections`` open connections, a new one is answered 503 with
  ``Retry-After`` and closed before anything of it is read;
- a chunked body's trailer fields are dropped, never added to the request's headers;
- after a refusal that ends the connection (400, 408, 431), it lingers as nginx does
  (``linger.py``), so the client reads the refusal, not a reset.

Request bodies are bounded by the front itself (``body.py``, the request's one reader).

Two things make the proxy cheaper per request (a request's :class:`ConnectionLink`, in its
scope): the proxy learns from ``connection_lost`` that a client left, instead of keeping a
task per request waiting for ``http.disconnect``; and a complete response's head is held
until its body comes, so both leave in one write.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from app_toolkit._runtime.answers import as_bytes
from app_toolkit._runtime.connection_table import Handed, Phase, bytes_written
from app_toolkit._runtime.front.https import client_cert_of
from app_toolkit._runtime.front.linger import Lingering
from app_toolkit._runtime.front.request_link import REQUEST_LINK, ConnectionLink, Writes
from app_toolkit._runtime.front.scope import CLIENT_CERT
from app_toolkit._runtime.front.uvicorn_compat import HttpToolsProtocol
from app_toolkit._runtime.messages import HTTPResponse
from app_toolkit.config import HTTPOptions

logger = logging.getLogger("app_toolkit.proxy")

#: Bytes a handed connection's read takes at most (what asyncio's socket transport reads).
_READ_BYTES = 256 << 10
#: One read buffer per thread for every handed connection: the event loop fills it and
#: passes it on in one call, and what came is copied before anything else runs.
_buffers = threading.local()


def _refusal(status: int, text: str, retry_after_s: int | None = None) -> bytes:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    return as_bytes(HTTPResponse(status, headers, body))


def _app_may_run(handed: Handed, writes: Writes) -> None:
    """A request's app may run from now on: recorded as a response not yet begun, so the
    proxy answers 502 only if all the connection wrote before left (a client may send a
    request before it read the last response whole); RUNNING where the kernel counts
    nothing. Its first write records the response's start again (``Writes.starting``)."""
    if writes.sent is None:
        handed.record(Phase.RUNNING)
    else:
        handed.started(writes.sent)
    writes.starting = handed


class _Sealed(list[tuple[bytes, bytes]]):
    """A request's head fields once the head is complete: what is appended after (a
    chunked body's trailer fields) is dropped."""

    __slots__ = ()

    def append(self, field: tuple[bytes, bytes]) -> None:
        pass


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with limits; see :func:`guarded_protocol`."""

    options: HTTPOptions  # set on the subclass guarded_protocol() makes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes: int | None = None  # bytes of the request head so far; None: not in one
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_deadline = 0.0  # loop time by which the current head must be whole
        self._writes: Writes | None = None
        #: A connection the node's proxy handed over and keeps a copy of: its phases go to
        #: the table they share (connection_table.py), and it is shut down when done.
        self.handed: Handed | None = None
        self._between = False  # handed: between requests (the next bytes start one)
        self._given_back = False
        self._lingering: Lingering | None = None  # after a refusal (linger.py)
        self._head_refused = False  # a head came too large or too slow while a response was out
        self._client_cert: str | None = None  # the certificate the client presented (TLS)

    def handed_reads(self, handed: Handed) -> HandedReads:
        """Record this handed-off connection's phases in ``handed``'s table; returns the
        protocol the event loop must serve the connection with (it records each request's
        start before reading it)."""
        self.handed = handed
        self._between = True
        return HandedReads(self)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._client_cert = client_cert_of(transport)
        # A handed-off connection counts what it writes from the kernel's count (what the
        # proxy or a replica before wrote), so the proxy can tell a response's end arrived.
        handed = self.handed
        self._writes = writes = Writes(transport, bytes_written(handed.sock) if handed is not None else None)
        writes.closing = self._close_after_response
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
        if self._lingering is not None:
            self._lingering.stop()
        if self.handed is not None and not self._given_back:
            self.handed.done()  # the proxy's copy would keep the connection open
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:  # its response is not complete
            # An upgrade's cycle has no link: the WebSocket protocol took the connection.
            left = getattr(cycle.scope.get(REQUEST_LINK), "on_client_left", None)
            if left is not None:
                left()

    def request_may_start(self) -> None:
        """Bytes are about to be read (:class:`HandedReads`): if the connection is between
        requests, they start one."""
        if self._between:
            assert self.handed is not None
            self.handed.record(Phase.HEAD)
            self._between = False

    def data_received(self, data: bytes) -> None:
        if self._lingering is not None:
            self._lingering.discard(len(data))
            return
        super().data_received(data)
        if self._head_bytes is None or self.transport.is_closing():
            return
        # A head is still incomplete after this read: count it, and time it (a head that
        # arrives whole in one read, the usual case, costs no timer).
        self._head_bytes += len(data)
        if self._head_bytes > self.options.max_header_bytes:
            self._refuse(
                431,
                f"Request line and headers exceed {self.options.max_header_bytes} bytes (max_header_bytes).",
            )
        elif self._head_timer is None:
            self._head_timer = self.loop.call_at(self._head_deadline, self._head_too_slow)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._head_deadline = self.loop.time() + self.options.header_timeout_s

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        if self._head_timer is not None:
            self._stop_head_timer()
        super().on_headers_complete()
        # A chunked body's trailer fields come to on_header too, which appends them to
        # the list the scope holds: the app would see them among the request's headers,
        # or not, as the reads fell. From here on they go nowhere (ASGI has no request
        # trailers; docs/http.md), and nothing a trailer says changes what uvicorn reads
        # of the head (its upgrade check reads this list) or grows unbounded.
        self.headers = _Sealed(self.headers)
        if self._client_cert is not None:
            self.scope[CLIENT_CERT] = self._client_cert  # type: ignore[literal-required]
        cycle = self.cycle
        writes, handed = self._writes, self.handed
        if cycle is not None and cycle.scope is self.scope and writes is not None:  # not an upgrade
            cycle.transport = writes  # type: ignore[assignment]
            self.scope[REQUEST_LINK] = ConnectionLink(writes, cycle, handed)  # type: ignore[literal-required]
            if handed is not None and not self.pipeline:  # (a pipelined one waits its turn)
                _app_may_run(handed, writes)

    def on_response_complete(self) -> None:
        writes, handed, cycle = self._writes, self.handed, self.cycle
        pipelined = bool(self.pipeline)
        # A handed-off connection with nothing of a next request read is between requests
        # once this response is out.
        between = (
            handed is not None
            and not pipelined
            and cycle is not None
            and not cycle.more_body
            and self._head_bytes is None
            and not self.transport.is_closing()
        )
        # What is held ends the response: recorded ENDING before it is written (a replica
        # killed after the write would otherwise leave STARTED, and the proxy would close a
        # connection whose response was whole). ENDING stays until the next request: the
        # proxy reads it as between requests once the kernel has all of it.
        ended = writes.release(handed if between else None) if writes is not None else False
        super().on_response_complete()
        if self._lingering is not None:  # ended: no keep-alive timer, no next request
            self._unset_keepalive_if_required()
            return
        if handed is None or writes is None or self.transport.is_closing():
            return
        if pipelined:  # the next request, read already, runs now
            # Under a request id the proxy makes until its own is recorded (cycle.py).
            handed.table.set_request_id(handed.slot, "")
            _app_may_run(handed, writes)
        elif between:
            if ended:
                pass  # ENDING, recorded with the response's last write
            elif writes.sent is not None:  # a stream, its end written with its last chunk
                handed.ending(writes.sent, writes.began)
            else:  # the kernel counts nothing: between requests, as far as is known
                handed.record(Phase.IDLE)
            self._between = True

    def handle_websocket_upgrade(self) -> None:
        handed = self.handed
        if handed is None:
            super().handle_websocket_upgrade()
            return
        # Until its handshake's answer reaches the kernel, a replica killed leaves the
        # client nothing: the proxy answers 502 (under a request id of its own: the one
        # recorded is an earlier request's on this connection), if all that the connection
        # wrote before is whole in the kernel too (an earlier response may still be going).
        cycle, writes = self.cycle, self._writes
        quiet = not self.pipeline and (cycle is None or cycle.response_complete)
        handed.table.set_request_id(handed.slot, "")
        handed.started(writes.sent if writes is not None and quiet else None)
        super().handle_websocket_upgrade()
        # uvicorn's WebSocket protocol serves the connection from here: it must end it too.
        upgraded = self.transport.get_protocol()
        ended = upgraded.connection_lost

        def connection_lost(exc: Exception | None) -> None:
            handed.done()
            ended(exc)

        upgraded.connection_lost = connection_lost  # type: ignore[method-assign]  # an instance's own

    def hand_back(self, give: Callable[[socket.socket, Handed | None], bool]) -> bool:
        """If the connection is between requests (nothing of a next one read), offer its
        socket to ``give`` (which passes it back to the proxy: direct ingress draining);
        if taken, let the connection go here without ending it for the client."""
        transport = self.transport
        if transport.is_closing() or self._head_bytes is not None or self.pipeline or self._lingering:
            return False
        if self.cycle is not None and (not self.cycle.response_complete or self.cycle.more_body):
            return False  # its response, or the rest of its request's body, is still to come
        if transport.get_write_buffer_size():
            return False  # its response's last bytes wait in the loop (the abort would drop them)
        if self.handed is not None:
            # Between requests, as checked: the next bytes start one, also if the proxy
            # does not take it (it may have been told IDLE after a read that found nothing).
            self._between = True
        sock = self.handed.sock if self.handed is not None else transport.get_extra_info("socket")
        if sock is None or not give(sock, self.handed):
            return False
        self._given_back = True
        self._stop_head_timer()
        transport.abort()  # our descriptor only: the proxy holds the connection now
        return True

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
        if self.transport.is_closing() or self._lingering is not None:
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "-"
        logger.info("%s: %d, closing the connection (%s)", client, status, text)
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(_refusal(status, text + "\n"))
            self.linger()
        else:  # a response is on its way: it finishes, then the connection closes (lingering)
            self._head_refused = True
            self.cycle.keep_alive = False
            self.flow.pause_reading()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's 400 for bytes that do not parse, ending in a lingering close."""
        transport = self.transport
        kept = _CloseAsked(transport)
        self.transport = kept  # type: ignore[assignment]  # all send_400_response uses
        try:
            super().send_400_response(msg)
        finally:
            self.transport = transport
        if kept.close_asked:
            self.linger()

    def _close_after_response(self) -> None:
        """A response cycle ends the connection (keep-alive off): lingering if the request's
        body, or a next request, is still arriving (or was refused), or a pipelined one
        was read (``self.cycle`` is then the latest request read, not the one ending)."""
        cycle = self.cycle
        arriving = self._head_bytes is not None or (cycle is not None and cycle.more_body)
        if arriving or self._head_refused or self.pipeline:
            self.linger()
        else:
            self.transport.close()

    def linger(self) -> None:
        """End the connection after a refusal written to it (``linger.py``)."""
        if self._lingering is None and not self.transport.is_closing():
            self._unset_keepalive_if_required()
            self._head_bytes = None  # no head is read any more
            self._stop_head_timer()
            self.pipeline.clear()  # requests read after it never run (as once closed)
            if self._writes is not None:
                self._writes.ended = True
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:  # its response cannot go out
                left = getattr(cycle.scope.get(REQUEST_LINK), "on_client_left", None)
                if left is not None:
                    left()
            self._lingering = Lingering(self.transport, self.loop)


class _CloseAsked:
    """A transport as uvicorn's ``send_400_response`` uses it: it writes, and a close
    is noted, for the protocol to linger instead."""

    __slots__ = ("write", "close_asked")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.write = transport.write
        self.close_asked = False

    def close(self) -> None:
        self.close_asked = True


class HandedReads(asyncio.BufferedProtocol):
    """What the event loop serves a handed-off connection with: it reads into a buffer
    this offers, and passes the bytes and every other event to the connection's
    :class:`GuardedHttpProtocol`.

    A request's start is recorded when the loop asks for the buffer, before the read
    takes the request's bytes out of the socket. Recorded after the read, a replica
    killed between the two would leave the connection between requests: the proxy would
    serve it anew, and the request, its bytes gone with the replica, would never be
    answered. The price: a replica killed after a wake-up that finds nothing to read
    leaves a request started, and the proxy answers that connection 503.

    A wrapper, not a subclass: uvloop reads through ``get_buffer`` only for protocols
    that are not ``asyncio.Protocol`` (uvicorn's is). A WebSocket upgrade replaces this
    with uvicorn's WebSocket protocol (``transport.set_protocol``).
    """

    __slots__ = ("http", "_view")

    def __init__(self, http: GuardedHttpProtocol) -> None:
        self.http = http
        self._view = _read_buffer()  # this thread's: the event loop's, which serves it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.http.connection_made(transport)  # type: ignore[arg-type]  # a socket transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.http.connection_lost(exc)

    def eof_received(self) -> bool | None:
        return self.http.eof_received()  # type: ignore[func-returns-value]  # uvicorn's returns None

    def pause_writing(self) -> None:
        self.http.pause_writing()

    def resume_writing(self) -> None:
        self.http.resume_writing()

    def get_buffer(self, sizehint: int) -> memoryview:
        self.http.request_may_start()
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        self.http.data_received(bytes(self._view[:nbytes]))


def _read_buffer() -> memoryview:
    try:
        view: memoryview = _buffers.view
    except AttributeError:
        view = _buffers.view = memoryview(bytearray(_READ_BYTES))
    return view


def guarded_protocol(options: HTTPOptions) -> type[GuardedHttpProtocol]:
    """The protocol class uvicorn should use for a proxy with ``options``."""
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"options": options})
