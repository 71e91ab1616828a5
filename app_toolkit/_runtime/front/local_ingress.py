"""What the front needs of the ingress replica in its own process (direct ingress): the
replica that may serve its application's requests on the connections it owns, in this
process. The front only calls it; the replica process implements it
(``backends/ray/direct.py``), so the front's code names no replica code."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from starlette.types import Receive, Scope, Send

from app_toolkit._runtime.front.cycle import HTTPCycle
from app_toolkit._runtime.messages import DeploymentID, Rejected
from app_toolkit._runtime.tracing import TraceContext
from app_toolkit.config import HTTPOptions


class LocalIngress(Protocol):
    """The replica in this process that serves its application's requests directly."""

    deployment: DeploymentID

    def admit(self) -> Rejected | None:
        """Take a slot (None), or why not (full or draining: the request is forwarded)."""
        ...

    def serve_http(
        self, scope: Scope, receive: Receive, cycle: HTTPCycle, http: HTTPOptions, trace: TraceContext | None
    ) -> Awaitable[None]:
        """One admitted request through the app, answered through ``cycle``, to be
        awaited (the slot is given back at its end). ``scope`` is the one the proxy would
        forward (the prefix as root_path); ``trace``: the span the replica's continues
        (None: the trace starts with the request, its ids made only if read)."""
        ...

    def serve_websocket(
        self, request_id: str, scope: Scope, trace: TraceContext, receive: Receive, send: Send
    ) -> Awaitable[None]:
        """One admitted WebSocket through the app (its ``websocket.connect`` was read
        already), to be awaited."""
        ...
