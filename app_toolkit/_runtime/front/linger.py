"""Lingering close, as nginx does it: how a connection ends after a refusal.

A server that refuses a request early (400, 408, 413, 431) and closes at once may still
have bytes of the request arriving: the kernel answers them with a reset, and a reset can
destroy the refusal in the client's receive buffer before the client reads it. Lingering,
the server's side ends after the refusal (FIN: the client reads the refusal and then the
end), and what the client still sends is read and thrown away until it ends its side too,
or a bound passes: ``LINGER_READ_S`` without a byte (nginx's ``lingering_timeout``),
``LINGER_TOTAL_S`` in all (``lingering_time``), or ``LINGER_BYTES`` read.
"""

from __future__ import annotations

import asyncio

LINGER_READ_S = 5.0
LINGER_TOTAL_S = 30.0
LINGER_BYTES = 64 << 20


class Lingering:
    """One connection lingering: made once its refusal is written to ``transport``; the
    connection's protocol passes what it reads to :meth:`discard`, and :meth:`stop` when
    the connection is lost."""

    __slots__ = ("_transport", "_loop", "_left", "_end", "_timer")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._left = LINGER_BYTES
        self._end = loop.time() + LINGER_TOTAL_S
        self._timer: asyncio.TimerHandle | None = None
        try:
            transport.write_eof()  # after what is buffered: the refusal
        except (OSError, RuntimeError, NotImplementedError):
            transport.close()
            return
        self._timer = loop.call_later(LINGER_READ_S, self._over)
        transport.resume_reading()  # a paused body's reads included

    def discard(self, size: int) -> None:
        """``size`` more bytes came, and were thrown away."""
        self._left -= size
        self.stop()
        if self._left <= 0:
            self._over()
        elif not self._transport.is_closing():
            self._timer = self._loop.call_at(min(self._loop.time() + LINGER_READ_S, self._end), self._over)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _over(self) -> None:
        self._timer = None
        transport = self._transport
        if transport.is_closing():
            return
        if transport.get_write_buffer_size():  # the client has not read the refusal all this time
            transport.abort()
        else:
            transport.close()
