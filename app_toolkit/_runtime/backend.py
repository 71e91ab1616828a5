"""The seam between the controller and where replicas run (Ray actors or this process).

Strings select implementations, as uvicorn does for its protocols: ``"ray"`` (default) or
``"local"``; ``"auto"`` is ``"ray"``.
"""

from __future__ import annotations

from typing import Any, Protocol

from app_toolkit._runtime.messages import AdoptedReplica, DeploymentSpec, ReplicaInfo
from app_toolkit.config import DeploymentConfig
from app_toolkit.exceptions import ConfigError

BACKENDS = ("auto", "ray", "local")


class Backend(Protocol):
    """What the controller needs from a backend."""

    async def start_replica(self, replica_id: str, spec: DeploymentSpec) -> tuple[ReplicaInfo, Any]:
        """Start and initialize a replica; raise DeployError with the user's message."""
        ...

    async def stop_replica(self, handle: Any, graceful: bool) -> None:
        """Drain (if graceful) and stop a replica; never raises."""
        ...

    async def check_health(self, handle: Any, timeout_s: float) -> None:
        """Raise if the replica is unhealthy (ReplicaUnavailableError if it is gone)."""
        ...

    async def reconfigure_replica(self, handle: Any, config: DeploymentConfig) -> None:
        """Apply new light options (user_config, limits) to a running replica in place."""
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


def resolve_backend_name(name: str) -> str:
    """Validate a backend name; ``auto`` means ``ray``."""
    if name not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {name!r}")
    return "ray" if name == "auto" else name
