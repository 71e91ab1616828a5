"""Our HTTP protocol on a connection made in process: a transport that keeps what is
written, for tests that drive uvicorn's protocol (and ours on it) without sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from app_toolkit._runtime.front.http_guard import guarded_protocol
from app_toolkit.config import HTTPOptions


class KeptTransport(asyncio.Transport):
    """A connection's transport that keeps what is written."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closing = False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def guarded(app: Any, state: ServerState | None = None, **uvicorn_options: Any) -> Any:
    """Our protocol (``guarded_protocol``) for ``app``, as uvicorn's server makes one;
    typed Any: uvicorn types it as any asyncio.Protocol."""
    config = uvicorn.Config(app, lifespan="off", http=guarded_protocol(HTTPOptions()), **uvicorn_options)
    config.load()
    make: Any = config.http_protocol_class
    return make(config=config, server_state=state or ServerState(), app_state={})


async def served(protocol: Any, request: bytes, times: int = 1) -> KeptTransport:
    """Write ``request`` into a new connection of ``protocol`` ``times`` times (while it
    stays open), each once the app has had its turns; returns the connection's transport."""
    transport = KeptTransport()
    protocol.connection_made(transport)
    for _ in range(times):
        if transport.closing:
            break
        protocol.data_received(request)
        for _ in range(50):  # the app runs as the protocol's task
            await asyncio.sleep(0)
    return transport
