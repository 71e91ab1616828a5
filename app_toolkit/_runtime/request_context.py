"""Per-request context that crosses from the replica into user code."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

#: The id of the request being served; downstream handle calls carry it on.
request_id: ContextVar[str] = ContextVar("app_toolkit_request_id", default="")

#: The user-class instance of the replica serving this request (for ``@ingress`` classes).
replica_instance: ContextVar[Any] = ContextVar("app_toolkit_replica_instance", default=None)

#: The application the current replica belongs to (for handles to its sibling deployments).
app_name: ContextVar[str] = ContextVar("app_toolkit_app_name", default="")

#: The HTTP header that names a request's multiplexed model (Ray Serve's name).
MODEL_ID_HEADER = "serve_multiplexed_model_id"

#: Where the current request names its multiplexed model: the id itself (handle calls),
#: or an HTTP/WebSocket scope's headers, read only if someone asks (see ``current_model_id``).
model_id: ContextVar[str | list[tuple[bytes, bytes]]] = ContextVar("app_toolkit_model_id", default="")

_MODEL_ID_HEADER_BYTES = MODEL_ID_HEADER.encode()


def current_model_id() -> str:
    """The multiplexed model the current request asks for ("" if none)."""
    source = model_id.get()
    if isinstance(source, str):
        return source
    for key, value in source:
        if key == _MODEL_ID_HEADER_BYTES:  # ASGI header names are lower-case
            return bytes(value).decode("latin-1")
    return ""


#: Tells the controller which multiplexed models the current replica holds (set by the
#: replica while it serves; None outside replicas).
report_models: ContextVar[Callable[[tuple[str, ...]], None] | None] = ContextVar(
    "app_toolkit_report_models", default=None
)

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
