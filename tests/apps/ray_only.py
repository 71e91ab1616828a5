"""Apps for Ray-only tests (they use the ray API inside replicas)."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

import ray
from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import StreamingResponse

import app_toolkit as tk
from tests.deployments import as_deployment


@tk.deployment(ray_actor_options={"num_cpus": 0.5, "resources": {"test_accelerator": 0.5}})
class Resourced:
    def assigned(self) -> dict[str, float]:
        # ray leaves get_assigned_resources unannotated.
        return dict(ray.get_runtime_context().get_assigned_resources())  # type: ignore[no-untyped-call]


@tk.deployment(num_replicas=2, health_check_period_s=0.5, health_check_timeout_s=2)
class Pid:
    def __call__(self) -> int:
        return os.getpid()

    def identity(self) -> tuple[str, int]:
        return str(ray.get_runtime_context().get_actor_name()), os.getpid()


where_router = APIRouter()


@where_router.get("/where")
async def where() -> dict[str, str]:
    """The node and replica that served this request."""
    return {"node": ray.get_runtime_context().get_node_id(), "replica": tk.get_replica_context().replica_id}


@where_router.get("/owner")
async def owner(request: Request) -> dict[str, object]:
    """Whether this replica's process holds the client's TCP connection (direct ingress)."""
    assert request.client is not None
    return {"owns": holds_connection_from(request.client.port), "pid": os.getpid()}


@where_router.get("/ticks")
async def ticks() -> StreamingResponse:
    """An endless chunked response: this process's pid, then a tick every 50 ms."""

    async def produce() -> AsyncIterator[bytes]:
        yield f"pid {os.getpid()}\n".encode()
        while True:
            await asyncio.sleep(0.05)
            yield b"tick\n"

    return StreamingResponse(produce(), media_type="text/plain")


#: WebSockets whose handshake this process holds unanswered (``/held-socket``).
_held_sockets = 0


@where_router.websocket("/held-socket")
async def held_socket(websocket: WebSocket) -> None:
    """A WebSocket whose handshake is answered only after a minute."""
    global _held_sockets
    _held_sockets += 1
    await asyncio.sleep(60)
    await websocket.accept()
    await websocket.close()


@where_router.get("/held-sockets")
async def held_sockets() -> dict[str, int]:
    """How many ``/held-socket`` handshakes this process holds, and its pid."""
    return {"held": _held_sockets, "pid": os.getpid()}


def holds_connection_from(port: int) -> bool:
    """This process has a socket connected to a peer on local port ``port``."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[9] in inodes and int(fields[2].rsplit(":", 1)[1], 16) == port:
                    return True
    return False


def make_where_app(**options: object) -> tk.Application:
    """Two replicas that report where they run, with quick health checks."""
    settings: dict[str, Any] = {
        "num_replicas": 2,
        "health_check_period_s": 0.5,
        "health_check_timeout_s": 2,
        "graceful_shutdown_timeout_s": 2,
        **options,
    }
    return tk.App(where_router, **settings)


@tk.deployment
class Environment:
    """Reads its replica process's environment."""

    def get(self, name: str) -> str | None:
        return os.environ.get(name)

    def frozen(self) -> int:
        """Objects the collector no longer walks (gc.freeze() once the replica started)."""
        return gc.get_freeze_count()


# --8<-- [start:continuable]
@dataclasses.dataclass(frozen=True)
class Count:
    """Count from ``start`` up to ``stop``, an item every ``every_s``."""

    stop: int
    every_s: float = 0.05
    start: int = 0


def count_on(request: Count, produced: Sequence[object]) -> Count:
    """The count after the items its caller has: they were ``start``, ``start + 1``, ..."""
    return dataclasses.replace(request, start=request.start + len(produced))


@tk.deployment(num_replicas=2, health_check_period_s=0.5, health_check_timeout_s=2)
class Counter:
    """A continuable stream: each item is a number and the pid of the process counting."""

    @tk.continuable(count_on)
    async def count(self, request: Count) -> AsyncIterator[tuple[int, int]]:
        for number in range(request.start, request.stop):
            yield number, os.getpid()
            await asyncio.sleep(request.every_s)

    # --8<-- [end:continuable]

    async def plain(self, request: Count) -> AsyncIterator[tuple[int, int]]:
        """The same stream, not continuable."""
        async for item in self.count(request):
            yield item

    @tk.continuable(count_on, max_bytes=1_000)
    async def bounded(self, request: Count) -> AsyncIterator[tuple[int, int]]:
        """The same stream, continuable while its caller keeps at most 1,000 bytes of it
        (a few items: each counts its pickled size and 128 bytes more)."""
        async for item in self.count(request):
            yield item


def make_counting_app(counter: tk.Application) -> tk.Application:
    """An ingress streaming a Counter's numbers over HTTP, a line per number."""
    router = APIRouter()

    @router.get("/count/{stop}")
    async def count(stop: int, method: str = "count") -> StreamingResponse:
        handle = tk.get_deployment_handle("Counter").options(stream=True, method_name=method)

        async def lines() -> AsyncIterator[bytes]:
            async for number, pid in handle.remote(Count(stop)):
                yield f"{number} {pid}\n".encode()

        return StreamingResponse(lines(), media_type="text/plain")

    @tk.deployment
    @tk.ingress(router)
    class CountingIngress:
        def __init__(self, counter: tk.DeploymentHandle) -> None:
            self.counter = counter

    return as_deployment(CountingIngress).bind(counter)
