"""What the controller needs from where replicas run: the backend port.

Implemented by the Ray backend (replica actors, the GCS) and the local backend (objects
on the controller's loop); the controller is written against this protocol alone.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from app_toolkit._runtime.messages import AdoptedReplica, DeploymentSpec, ReplicaInfo
from app_toolkit._runtime.tables import Table
from app_toolkit.config import DeploymentConfig

H = TypeVar("H")  # a backend's own handle to one replica (an actor, an object)


class Backend(Protocol[H]):
    """What the controller needs from where replicas run."""

    async def start_replica(self, replica_id: str, spec: DeploymentSpec, rank: int) -> tuple[ReplicaInfo, H]:
        """Start and initialize a replica; raise DeployError with the user's message."""
        ...

    async def stop_replica(self, handle: H, graceful: bool) -> None:
        """Drain (if graceful) and stop a replica; never raises."""
        ...

    async def check_health(self, handle: H, timeout_s: float) -> None:
        """Raise if the replica is unhealthy (ReplicaUnavailableError if it is gone)."""
        ...

    async def reconfigure_replica(self, handle: H, config: DeploymentConfig) -> None:
        """Apply new in-place options (user_config, limits) to a running replica."""
        ...

    async def find_replicas(self) -> list[AdoptedReplica]:
        """Replicas still running from a previous controller (stopping the unusable ones)."""
        ...

    async def save_checkpoint(self, data: bytes) -> None:
        """Persist the controller's desired state."""
        ...

    async def load_checkpoint(self) -> bytes | None:
        """The last persisted desired state, if any."""
        ...

    async def save_tables(self, tables: dict[str, Table]) -> None:
        """Persist the tables last published, for callers that start while the
        controller is down."""
        ...

    async def stop_proxies(self) -> None:
        """At shutdown: stop the HTTP proxies (each finishes its open connections,
        bounded) and forget what would let them start again by themselves."""
        ...
