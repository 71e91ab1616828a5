"""``front_cost``'s wire modes: a request from its bytes to its response's bytes, through the
HTTP protocol as well (what the replica's thread runs for it, but the kernel and the
event loop's polling), in one process without Ray.

- ``wire-bare``: uvicorn's httptools protocol with the FastAPI app (bare uvicorn);
- ``wire-direct``: our protocol on a connection the node's proxy handed over (its phases
  recorded in a connection table), the front and the replica: a request on a
  replica-owned connection.

The request is ``front_cost``'s (GET ``/small``), written into the protocol as a socket's
read would deliver it; the transport only counts what is written. A handed connection's
record needs a TCP socket to read the kernel's count from: one loopback connection is
made for it, and nothing is sent on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.server import ServerState

from app_toolkit._runtime.connection_table import ConnectionTable, Handed
from app_toolkit._runtime.front.server import uvicorn_config
from app_toolkit.config import HTTPOptions

MODES = ("wire-bare", "wire-direct")
#: Loop turns a request may take before it counts as unanswered.
_TURNS = 1000
REQUEST = b"GET /small HTTP/1.1\r\nhost: 127.0.0.1:8000\r\nuser-agent: wrk\r\naccept: */*\r\n\r\n"


class _Counting(asyncio.Transport):
    """A connection's transport that keeps nothing of what is written but its length."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.status = b""
        self.closing = False
        self._protocol: asyncio.BaseProtocol | None = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += len(data)
        if bytes(data[:9]) == b"HTTP/1.1 ":
            self.status = bytes(data[9:12])  # the latest response's

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol


def _handed(cleanup: contextlib.ExitStack) -> Handed:
    """A handed connection's record (its table's one slot), let go by ``cleanup``."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = cleanup.enter_context(socket.create_connection(listener.getsockname()))
        served = cleanup.enter_context(listener.accept()[0])
    table, fd = ConnectionTable.create(1)
    os.close(fd)
    cleanup.callback(table.close)
    return Handed(client, table, 0, ConnectionTable.offset(0), served)


#: Runs a request's coroutine function for rounds: (one, requests, rounds) -> figures.
Timed = Callable[[Callable[[], Awaitable[None]], int, int], Awaitable[list[float]]]


async def rounds(mode: str, app: ASGIApp, requests: int, count: int, timed: Timed) -> list[float]:
    """``count`` rounds of ``requests`` through ``app`` behind the protocol of ``mode``,
    timed by ``timed`` (``front_cost``'s, which warms up first)."""
    if mode == "wire-direct":  # as the toolkit's server has uvicorn serve it, defaults
        config = uvicorn_config(app, HTTPOptions())
    else:  # as `uvicorn main:app --no-access-log` would
        config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False, http="httptools")
    config.load()
    state = ServerState()
    state.default_headers = [(b"date", formatdate(usegmt=True).encode()), *config.encoded_headers]
    make: Any = config.http_protocol_class  # uvicorn types it as any asyncio.Protocol
    protocol = make(config=config, server_state=state, app_state={})
    transport = _Counting()
    with contextlib.ExitStack() as cleanup:
        if mode == "wire-direct":
            handed = _handed(cleanup)
            reads = protocol.handed_reads(handed)
            reads.connection_made(transport)

            def deliver() -> None:  # as the event loop reads into the buffer the protocol offers
                view = reads.get_buffer(-1)
                view[: len(REQUEST)] = REQUEST
                reads.buffer_updated(len(REQUEST))
        else:
            protocol.connection_made(transport)

            def deliver() -> None:
                protocol.data_received(REQUEST)

        cleanup.callback(protocol.connection_lost, None)
        return await timed(_one(mode, protocol, transport, deliver), requests, count)


def _one(
    mode: str, protocol: Any, transport: _Counting, deliver: Callable[[], None]
) -> Callable[[], Awaitable[None]]:
    """One request: delivered, then the loop turned until its response is whole."""

    async def one() -> None:
        before = transport.written
        deliver()
        for _ in range(_TURNS):  # the app runs as the protocol's task
            if transport.closing or transport.written > before and protocol.cycle.response_complete:
                break
            await asyncio.sleep(0)
        if transport.status != b"200" or transport.closing:
            raise RuntimeError(f"{mode}: the request was not answered 200 on an open connection")

    return one
