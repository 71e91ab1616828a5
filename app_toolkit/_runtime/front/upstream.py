"""Where the front sends a request or WebSocket of an application: an :class:`Upstream`,
chosen once by :meth:`Placement.choose`, the one home of every placement rule.

Two implementations: over the channel to one of the app's replicas (``ChannelUpstream``,
``channel_upstream.py``), and the ingress replica in this very process (direct ingress:
its ``InReplica``, implemented by ``direct_ingress/replica_upstream.py``; the front names
no replica code).
"""

from __future__ import annotations

from typing import Protocol

from app_toolkit._runtime.front.cycle import Responder
from app_toolkit._runtime.front.scope import RequestHeaders
from app_toolkit._runtime.front.websocket import SocketResponder
from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.routing.subscriber import TableSubscriber


class Upstream(Responder, SocketResponder, Protocol):
    """Serves an application's requests (``http(cycle)``: answered through the cycle) and
    WebSockets (``websocket(socket)``: its ``websocket.connect`` read, for its whole life)."""


class InReplica(Upstream, Protocol):
    """The ingress replica of this process (direct ingress)."""

    @property
    def deployment(self) -> DeploymentID:
        """The deployment it is a replica of."""
        ...

    def has_room(self) -> bool:
        """It would admit a request now: a free slot, and not draining. Its upstream takes
        the slot when it starts, in the same step of the event loop."""
        ...


class Placement:
    """Chooses each request's and WebSocket's upstream."""

    __slots__ = ("_subscriber", "channel", "local", "_local_id")

    def __init__(self, subscriber: TableSubscriber, channel: Upstream, local: InReplica | None) -> None:
        self._subscriber = subscriber
        self.channel = channel
        self.local = local
        self._local_id: DeploymentID | None = None  # the table's ID object equal to local's

    def choose(self, deployment: DeploymentID, headers: RequestHeaders) -> Upstream:
        """The replica in this process, if it may serve the request or WebSocket itself
        and has a free slot: it is the deployment's, no multiplexed model or shard key
        asks for a replica chosen by key, and no traffic policy (a split, a shadow)
        applies to the deployment; else the channel."""
        local = self.local
        if local is None or headers.model_id or headers.shard_key:
            return self.channel
        if deployment is not self._local_id:  # the route tables' own object, once compared
            if deployment != local.deployment:
                return self.channel
            self._local_id = deployment
        if self._subscriber.dispatcher(deployment).has_policy or not local.has_room():
            return self.channel
        return local
