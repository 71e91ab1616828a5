"""Apps for Ray-only tests (they use the ray API inside replicas)."""

from __future__ import annotations

import gc
import os

import ray
from fastapi import APIRouter

import app_toolkit as tk


@tk.deployment(ray_actor_options={"num_cpus": 0.5, "resources": {"test_accelerator": 0.5}})
class Resourced:
    def assigned(self) -> dict[str, float]:
        return dict(ray.get_runtime_context().get_assigned_resources())


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


def make_where_app() -> tk.Application:
    """Two replicas that report where they run, with quick health checks."""
    return tk.App(
        where_router,
        num_replicas=2,
        health_check_period_s=0.5,
        health_check_timeout_s=2,
        graceful_shutdown_timeout_s=2,
    )


@tk.deployment
class Environment:
    """Reads its replica process's environment."""

    def get(self, name: str) -> str | None:
        return os.environ.get(name)

    def frozen(self) -> int:
        """Objects the collector no longer walks (gc.freeze() once the replica started)."""
        return gc.get_freeze_count()
