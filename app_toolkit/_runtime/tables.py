"""The tables the controller publishes and every caller (proxy, handle owner) follows.

Each table lives under a key of the long poll (``controller/longpoll.py``); a caller holds
the version it has of each key and gets newer values as they are published. What crosses
processes here is a frozen dataclass, never a bare tuple.
"""

from __future__ import annotations

import pickle
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from app_toolkit._runtime.compact import compact
from app_toolkit._runtime.messages import DeploymentID, ReplicaInfo, RouteInfo, StreamContinuation

#: The key of the application table (every application's prefix and routes).
APPLICATIONS_KEY = "applications"


def replicas_key(deployment: DeploymentID) -> str:
    """The key of one deployment's replica table."""
    return f"replicas:{deployment}"


@compact
@dataclass(frozen=True, slots=True)
class ShadowTarget:
    """Where copies of an application's requests go (routing/shadow.py)."""

    deployment: DeploymentID  # the shadow application's ingress
    fraction: float  # the share of requests copied
    #: "module:function" taking (primary answer, shadow answer) and returning whether they
    #: agree; "" compares statuses only.
    compare: str = ""


@compact
@dataclass(frozen=True, slots=True)
class RouterChoice:
    """A deployment's request router other than the callers' own power of two choices:
    its class's import path and its ``request_router_kwargs`` as JSON (docs/routing.md)."""

    path: str
    kwargs: str = "{}"


@compact
@dataclass(frozen=True, slots=True)
class ReplicaTable:
    """The running replicas of one deployment and how much its callers may queue."""

    replicas: tuple[ReplicaInfo, ...]
    #: Requests each caller may queue (``max_queued_requests``; -1: choice.QUEUE_CAP).
    max_queued_requests: int
    #: With a shard key, when the key's replica is full: wait for it, or use another.
    affinity: Literal["strict", "prefer"] = "strict"
    #: An application's ingress whose traffic is split (controller/traffic.py): each
    #: variant's ingress and its share. Empty: no split.
    split: tuple[tuple[DeploymentID, float], ...] = ()
    #: Where copies of a share of this application's requests go. None: no shadow.
    shadow: ShadowTarget | None = None
    #: The HTTP answer to a request refused for overload: status and Retry-After seconds
    #: (None: no header); the deployment's backpressure_config.
    overload: tuple[int, float | None] = (503, 1.0)
    #: The deployment's request router; None: power of two choices.
    router: RouterChoice | None = None
    #: Its continuable generator methods (``@continuable``).
    continuations: tuple[StreamContinuation, ...] = ()


@compact
@dataclass(frozen=True, slots=True)
class DeploymentGone:
    """The deployment was deleted, or failed before any replica ran: fail its waiters."""


@compact
@dataclass(frozen=True, slots=True)
class ApplicationTable:
    """Every application that serves HTTP: prefix, ingress and special routes."""

    applications: tuple[RouteInfo, ...]


Table = ReplicaTable | DeploymentGone | ApplicationTable


@dataclass(frozen=True, slots=True)
class Update:
    """A key's value as of ``version``; ``table`` is None for a key never published
    (version 0).

    The controller sends one update to every caller that follows its key.
    ``packed_form`` (made once, by ``Update.packed``) is its pickled form: each further caller costs a
    copy of those bytes instead of pickling the table again.
    """

    version: int
    table: Table | None
    packed_form: bytes = field(default=b"", compare=False, repr=False)

    @classmethod
    def packed(cls, version: int, table: Table | None) -> Update:
        return cls(version, table, pickle.dumps((version, table), protocol=pickle.HIGHEST_PROTOCOL))

    def __reduce__(self) -> tuple[Callable[..., Update], tuple[object, ...]]:
        if self.packed_form:
            return _unpack_update, (self.packed_form,)
        return Update, (self.version, self.table)


def _unpack_update(data: bytes) -> Update:
    version, table = pickle.loads(data)
    return Update(version, table)


#: Key -> the version a caller already holds (-1: none yet).
Versions = dict[str, int]
#: Key -> its newer value.
Updates = dict[str, Update]
#: Requests queued + running per deployment, as one caller reports them.
Loads = dict[DeploymentID, float]


@compact
@dataclass(frozen=True, slots=True)
class VariantOutcome:
    """What one caller saw of one variant of a traffic split since its last report:
    requests, errors (5xx, failed calls, no replica) and time to the first frame, as
    counts per bucket of ``metrics.SECONDS_BUCKETS`` (the last one: above them all)."""

    endpoint: str  # the application whose traffic is split
    variant: str  # the application the requests went to
    requests: int
    errors: int
    latency_counts: tuple[int, ...]


@compact
@dataclass(frozen=True, slots=True)
class ShadowOutcome:
    """What one caller's shadow copies did since its last report: copies answered,
    errors, answers that differ from the primary's (status, or failed vs not), copies
    dropped (the shadow busy or slow), and times to the first frame of the shadow and of
    the primaries copied (counts per bucket, as in VariantOutcome)."""

    endpoint: str
    shadow: str
    copies: int
    errors: int
    different: int
    dropped: int
    latency_counts: tuple[int, ...]
    primary_latency_counts: tuple[int, ...]


@compact
@dataclass(frozen=True, slots=True)
class ReplicaStats:
    """A replica's custom autoscaling metrics (its ``record_autoscaling_stats()``) since
    its process's last report: each sample's age in seconds when sent (the controller
    dates it on its own clock) and its values."""

    replica_id: str
    deployment: DeploymentID
    samples: tuple[tuple[float, tuple[tuple[str, float], ...]], ...]


@compact
@dataclass(frozen=True, slots=True)
class ReplicaRoutingStats:
    """A replica's newest routing stats (its ``record_routing_stats()``), as JSON: the
    controller puts them in its replica table entry (``ReplicaInfo.routing_stats``), where
    request routers read them. ``sequence`` counts the replica's samples: a report that
    arrives after a newer one is ignored."""

    replica_id: str
    deployment: DeploymentID
    stats: str
    sequence: int


Outcomes = tuple[VariantOutcome | ShadowOutcome | ReplicaStats | ReplicaRoutingStats, ...]

#: The controller's long-poll call, as a caller makes it.
Listen = Callable[[Versions, float], Awaitable[Updates]]
#: The controller's load-report call, as a caller makes it (with what it saw of splits,
#: and its replicas' custom metrics and routing stats).
ReportLoad = Callable[[str, Loads, Outcomes], Awaitable[None]]
