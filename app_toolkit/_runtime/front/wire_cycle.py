"""uvicorn's request cycle with one writer for a response's bytes, on our HTTP protocol
(``http_guard.py`` gives every request's cycle this class).

:class:`WireCycle` writes what uvicorn's ``RequestResponseCycle.send`` writes, by the same
rules: the status line, the server's default headers and then the response's, names in
lower case; a head or value uvicorn refuses raises its error; the body framed by
``content-length`` (checked) or chunked; nothing of a ``HEAD`` response's body; the
connection closed after a response that says or needs it. Its ``send`` (the app's ASGI
messages) and the front's whole responses and stream pieces
(:class:`~app_toolkit._runtime.front.request_link.RequestLink`) all go through
:meth:`WireCycle.write_head` and :meth:`WireCycle.write_body`: a whole response costs no ASGI
messages and one pass over its headers, whichever way it comes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast

from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

Headers = list[tuple[bytes, bytes]]

#: A header block uvicorn writes without an error: names without a character its
#: ``HEADER_RE`` refuses, values without one its ``HEADER_VALUE_RE`` refuses (so without CR
#: or LF: each line is one header).
_VALID = re.compile(rb'(?:[^\x00-\x1f\x7f()<>@,;:\[\]={} \t\\"]*: [^\x00-\x08\x0a-\x1f\x7f]*\r\n)*')
#: The headers that change what is written, in their order in a (valid) block.
_FRAMING = re.compile(rb"(?:\A|\n)(content-length|transfer-encoding|connection): ([^\r]*)\r")


class WireCycle(RequestResponseCycle):
    """One request's cycle on our protocol (uvicorn's, with this writer). Stateless
    beyond uvicorn's: the protocol turns the cycle uvicorn made into one."""

    async def send(self, message: ASGISendEvent) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        event = cast("Mapping[str, Any]", message)  # uvicorn types each message kind apart
        kind = event["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{kind}'.")
            self.write_head(event["status"], list(event.get("headers", [])))
        elif not self.response_complete:
            if kind != "http.response.body":
                raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
            self.write_body(event.get("body", b""), event.get("more_body", False))
        else:
            raise RuntimeError(f"Unexpected ASGI message '{kind}' sent, after response already completed.")

    def writable(self) -> bool:
        """A response's bytes may be written now, without waiting: the client is there
        and the transport takes writes (else ``send`` waits, or drops them)."""
        return not self.disconnected and not self.flow.write_paused

    def write_head(self, status: int, headers: Headers) -> None:
        """Write the response's head (the first thing of it, on a :meth:`writable` cycle)."""
        self.response_started = True
        self.waiting_for_100_continue = False
        if self.access_log:
            scope = self.scope
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(scope),
                scope["method"],
                get_path_with_query_string(scope),
                scope["http_version"],
                status,
            )
        line = STATUS_LINE[status]
        defaults, framed = _default_block(self.default_headers)
        try:
            block = b"".join([b"%s: %s\r\n" % (name.lower(), value) for name, value in headers])
        except (TypeError, AttributeError):  # not pairs of bytes: refused as uvicorn refuses them
            _refuse(headers)
            raise
        if _VALID.fullmatch(block) is None:
            _refuse(headers)
        content = [line, defaults, block]
        close_said = False
        for found in _FRAMING.finditer(defaults + block if framed else block):
            name, value = found[1], found[2]
            if name == b"content-length":
                if self.chunked_encoding is None:
                    self.expected_content_length = int(value.decode())
                    self.chunked_encoding = False
            elif name == b"transfer-encoding":
                if value.lower() == b"chunked":
                    self.expected_content_length = 0
                    self.chunked_encoding = True
            elif b"close" in [token.lower().strip() for token in value.split(b",")]:
                self.keep_alive = False
                close_said = True
        if not self.keep_alive and not close_said:
            content.append(b"connection: close\r\n")
        if self.chunked_encoding is None and self.scope["method"] != "HEAD" and status not in (204, 304):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        self.transport.write(b"".join(content))

    def write_body(self, body: bytes, more_body: bool) -> None:
        """Write a piece of the body after the head (the last one: ``more_body`` false)."""
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
        elif self.chunked_encoding:
            if body:
                data = b"%x\r\n%s\r\n" % (len(body), body)
                self.transport.write(data + b"0\r\n\r\n" if not more_body else data)
            elif not more_body:
                self.transport.write(b"0\r\n\r\n")
            else:
                self.transport.write(b"")
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            self.transport.write(body)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()


def _refuse(headers: Headers) -> None:
    """Raise uvicorn's error for the first header it refuses (what it applied of the
    headers before that one is not: the response fails, and its connection is closed)."""
    for name, value in headers:
        if HEADER_RE.search(name):
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_RE.search(value):
            raise RuntimeError("Invalid HTTP header value.")
    raise AssertionError("a refused header block with no refused header")  # pragma: no cover


#: The server's default headers (``date``, ``server``) as written, and whether they hold
#: a header that changes the framing, for the list they came in: uvicorn's server makes a
#: new list every second.
_defaults: tuple[Headers | None, bytes, bool] = (None, b"", False)


def _default_block(headers: Headers) -> tuple[bytes, bool]:
    global _defaults
    cached = _defaults  # read once: another thread's loop may replace it meanwhile
    if cached[0] is not headers:
        block = b"".join([b"%s: %s\r\n" % (name.lower(), value) for name, value in headers])
        if _VALID.fullmatch(block) is None:
            _refuse(headers)
        cached = _defaults = (headers, block, _FRAMING.search(block) is not None)
    return cached[1], cached[2]
