"""Where the current code runs: ``get_replica_context()`` inside a replica."""

from __future__ import annotations

from app_toolkit._runtime import request_context
from app_toolkit._runtime.request_context import ReplicaContext

__all__ = ["ReplicaContext", "get_replica_context"]


def get_replica_context() -> ReplicaContext:
    """The application, deployment and replica id of the replica running this code.

    Works in constructors, routes and deployment methods; raises RuntimeError elsewhere.
    """
    context = request_context.replica.get()
    if context is None:
        raise RuntimeError("get_replica_context() works only inside a replica")
    return context
