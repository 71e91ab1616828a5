"""What replicas record: requests finished, how long each took, and how many run now.

Labelled with the replica itself (several replicas share a process on the local
backend). ``route`` is the matched path template for HTTP and WebSocket requests and the
method name for handle calls — never a raw path.
"""

from __future__ import annotations

import weakref
from typing import Protocol

from app_toolkit import metrics

_REPLICA = ("application", "deployment", "replica")

PROCESSING = metrics.Histogram(
    "app_toolkit_replica_processing_seconds",
    "Time a replica spent on each request, from admission to the last byte or item",
    (*_REPLICA, "kind", "route"),
)
#: Read from PROCESSING: a request observed there is a request finished.
REQUESTS = metrics.Counter(
    "app_toolkit_replica_requests_total",
    "Requests a replica finished",
    (*_REPLICA, "kind", "route"),
    counts=PROCESSING,
)
ERRORS = metrics.Counter(
    "app_toolkit_replica_errors_total",
    "Requests whose user code raised (handle calls; HTTP errors are counted by status at the proxy)",
    (*_REPLICA, "kind", "route"),
)


class _Counted(Protocol):
    labels: tuple[str, str, str]
    ongoing: int


_replicas: weakref.WeakSet[_Counted] = weakref.WeakSet()


def _ongoing() -> dict[tuple[str, ...], float]:
    return {replica.labels: float(replica.ongoing) for replica in list(_replicas)}


ONGOING = metrics.Gauge(
    "app_toolkit_replica_ongoing_requests", "Requests a replica is running now", _REPLICA, read=_ongoing
)


def track(replica: _Counted) -> None:
    """Report ``replica.ongoing`` while the replica object lives."""
    _replicas.add(replica)
