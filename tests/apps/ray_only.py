"""Apps for Ray-only tests (they use the ray API inside replicas)."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import AsyncIterator
from typing import Any

import ray
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

import app_toolkit as tk


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
