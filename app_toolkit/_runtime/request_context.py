"""Per-request context that crosses from the replica into user code."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

#: The id of the request being served; downstream handle calls carry it on.
request_id: ContextVar[str] = ContextVar("app_toolkit_request_id", default="")

#: The user-class instance of the replica serving this request (for ``@ingress`` classes).
replica_instance: ContextVar[Any] = ContextVar("app_toolkit_replica_instance", default=None)

#: The application the current replica belongs to (for handles to its sibling deployments).
app_name: ContextVar[str] = ContextVar("app_toolkit_app_name", default="")

#: Set when the serving replica starts draining (streams end with a final event).
draining: ContextVar[Any] = ContextVar("app_toolkit_draining", default=None)


@dataclass(frozen=True, slots=True)
class ReplicaContext:
    """Which replica is running the current code."""

    app_name: str
    deployment: str
    replica_id: str


#: The replica running the current code (None outside replicas).
replica: ContextVar[ReplicaContext | None] = ContextVar("app_toolkit_replica", default=None)


def enter_replica(context: ReplicaContext) -> None:
    """Mark the current task as running in ``context``'s replica."""
    app_name.set(context.app_name)
    replica.set(context)
