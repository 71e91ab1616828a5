"""HTTP protocols on connections made in process: a transport that keeps what is
written, for tests that drive uvicorn's protocol (and ours on it) without sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from app_toolkit._runtime.front import uvicorn_compat
from app_toolkit._runtime.front.http_guard import guarded_protocol
from app_toolkit.config import HTTPOptions
from tests.waiting import wait_for_async


class KeptTransport(asyncio.Transport):
    """A connection's transport that keeps what is written, and each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.writes: list[bytes] = []
        self.closing = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data
        if data:
            self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def abort(self) -> None:
        self.closing = True


def _protocol(app: Any, state: ServerState | None, http: Any) -> Any:
    # log_config=None: uvicorn's own logging set-up would change this process's loggers.
    # The front's WebSocket protocol: uvicorn's "auto" before 0.50 loads websockets' legacy
    # one, deprecated (a warning, an error here) from websockets 14.
    ws = uvicorn_compat.WebSocketProtocol
    config = uvicorn.Config(app, lifespan="off", log_config=None, http=http, ws=ws)
    config.load()
    make: Any = config.http_protocol_class  # uvicorn types it as any asyncio.Protocol
    return make(config=config, server_state=state or ServerState(), app_state={})


def guarded(app: Any, state: ServerState | None = None) -> Any:
    """Our protocol (``guarded_protocol``) for ``app``, as uvicorn's server makes one."""
    return _protocol(app, state, guarded_protocol(HTTPOptions()))


def plain(app: Any, state: ServerState | None = None) -> Any:
    """uvicorn's own httptools protocol for ``app``."""
    return _protocol(app, state, "httptools")


async def served(
    protocol: Any, request: bytes, times: int = 1, between: Callable[[], None] | None = None
) -> KeptTransport:
    """Write ``request`` into a new connection of ``protocol`` ``times`` times (while it
    stays open), each once what it asked for is answered (or the connection closed);
    ``between`` runs before each next time. Returns the connection's transport."""
    transport = KeptTransport()
    protocol.connection_made(transport)
    for turn in range(times):
        if transport.closing:
            break
        if turn and between is not None:
            between()
        protocol.data_received(request)
        await wait_for_async(lambda: transport.closing or _answered(protocol), 5, "the answer", 0)
        await asyncio.sleep(0)  # the app's task ends
    return transport


def _answered(protocol: Any) -> bool:
    cycle = protocol.cycle
    return cycle is not None and cycle.response_complete and not protocol.pipeline
