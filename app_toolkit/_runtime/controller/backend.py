"""What the controller needs from where replicas run: the backend port.

Implemented by the Ray backend (replica actors, the GCS) and the local backend (objects
on the controller's loop); the controller is written against this protocol alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from app_toolkit._runtime.messages import AdoptedReplica, DeploymentSpec, ReplicaInfo
from app_toolkit._runtime.request_context import ReplicaRank
from app_toolkit._runtime.tables import Table
from app_toolkit.config import DeploymentConfig

H = TypeVar("H")  # a backend's own handle to one replica (an actor, an object)


@dataclass(frozen=True, slots=True)
class Seat:
    """A replica's place in its deployment: ``rank`` among its version's replicas, of
    ``world_size``; ``place`` gives its whole rank once the backend knows its node (node
    id; "" where there are no nodes), before its constructor runs."""

    rank: int
    world_size: int
    place: Callable[[str], ReplicaRank]


@dataclass(frozen=True, slots=True)
class Unplaced:
    """Why the cluster cannot place a replica that is starting, in words ("needs
    {'accel': 1.0}: none free"), and whether no node could ever hold it."""

    reason: str
    infeasible: bool = False


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What the cluster says now: nodes that are leaving (node id -> seconds until they
    go; ``inf`` without a deadline) and the replicas being started that it cannot place."""

    draining: dict[str, float] = field(default_factory=dict)
    unplaced: dict[str, Unplaced] = field(default_factory=dict)
    #: The replicas whose starts this view covers (those not in ``unplaced`` are placed,
    #: or wait for nothing the cluster lacks).
    starting: frozenset[str] = frozenset()


class Backend(Protocol[H]):
    """What the controller needs from where replicas run."""

    async def start_replica(self, replica_id: str, spec: DeploymentSpec, seat: Seat) -> tuple[ReplicaInfo, H]:
        """Start and initialize a replica; raise DeployError with the user's message.
        Cancelled (the replica is no longer wanted): abandon the start, leaving nothing."""
        ...

    async def stop_replica(
        self, handle: H, graceful: bool, hurry: bool = False, grace_s: float | None = None
    ) -> None:
        """Drain (if graceful; ``hurry``: its streams end at once; ``grace_s``: a grace
        period shorter than its own) and stop a replica; never raises."""
        ...

    async def cluster_view(self) -> ClusterView:
        """Nodes leaving and replicas that cannot be placed (cheap: called every second
        or so)."""
        ...

    async def release_node(self, node_id: str) -> None:
        """A leaving node runs none of the toolkit's replicas anymore: stop what else of
        the toolkit runs there (its proxy, once it has finished its connections), so the
        node can go."""
        ...

    def load_object(self, data: bytes) -> object:
        """User code the backend serialized (an autoscaling policy), loaded here."""
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

    async def proxies_lagging(self, key: str, version: int, timeout_s: float) -> list[str]:
        """The nodes whose HTTP proxy does not hold ``key``'s table at ``version`` or later
        after up to ``timeout_s`` (empty: every proxy holds it)."""
        ...

    async def stop_proxies(self) -> None:
        """At shutdown: stop the HTTP proxies (each finishes its open connections,
        bounded) and forget what would let them start again by themselves."""
        ...
