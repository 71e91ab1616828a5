"""What callers (proxies, replicas calling handles, drivers) record per deployment they
call: requests waiting in their queue, requests running, requests refused because the
queue was full, and how long handle calls took. ``application``/``deployment`` name the deployment called;
``caller`` names who calls it (``proxy``, a replica id, or ``driver``)."""

from __future__ import annotations

import weakref
from typing import Protocol

from app_toolkit import metrics
from app_toolkit._runtime.messages import DeploymentID

_LABELS = ("application", "deployment", "caller")


class _Caller(Protocol):
    deployment: DeploymentID

    @property
    def queued(self) -> int: ...

    @property
    def in_flight(self) -> int: ...


_dispatchers: weakref.WeakSet[_Caller] = weakref.WeakSet()
#: Who this process is, as a caller (set by its host at start).
_caller = ["driver"]


def set_caller(name: str) -> None:
    _caller[0] = name


def _sum(read: str) -> dict[tuple[str, ...], float]:
    totals: dict[tuple[str, ...], float] = {}
    for dispatcher in list(_dispatchers):
        key = (dispatcher.deployment.app, dispatcher.deployment.name, _caller[0])
        totals[key] = totals.get(key, 0.0) + getattr(dispatcher, read)
    return totals


QUEUED = metrics.Gauge(
    "app_toolkit_caller_queued_requests",
    "Requests waiting in a caller's queue for a replica of the deployment",
    _LABELS,
    read=lambda: _sum("queued"),
)
RUNNING = metrics.Gauge(
    "app_toolkit_caller_running_requests",
    "Requests a caller has sent to replicas of the deployment and not finished",
    _LABELS,
    read=lambda: _sum("in_flight"),
)
REJECTED = metrics.Counter(
    "app_toolkit_caller_rejected_requests_total",
    "Requests refused because the caller's queue was full (503 over HTTP, BackPressureError)",
    _LABELS,
)


CALLS = metrics.Histogram(
    "app_toolkit_handle_request_seconds",
    "Handle calls (not streams), from the call to its result; outcome ok, error or cancelled",
    (*_LABELS, "method", "outcome"),
)


def called(deployment: DeploymentID, method: str, outcome: str, seconds: float) -> None:
    CALLS.observe(seconds, deployment.app, deployment.name, _caller[0], method, outcome)


def track(dispatcher: _Caller) -> None:
    _dispatchers.add(dispatcher)


SPLIT = metrics.Counter(
    "app_toolkit_traffic_requests_total",
    "Requests for an application with a traffic split, by the variant they went to",
    ("application", "variant", "caller"),
)


def split_to(endpoint: DeploymentID, variant: DeploymentID) -> None:
    SPLIT.inc(endpoint.app, variant.app, _caller[0])


def rejected(deployment: DeploymentID) -> None:
    REJECTED.inc(deployment.app, deployment.name, _caller[0])


CONTINUATIONS = metrics.Counter(
    "app_toolkit_stream_continuations_total",
    "Streams of continuable methods sent again after their replica was lost; outcome "
    "continued (another replica took it on) or ended (none did in time, or the stream's "
    "limit or item bound was reached)",
    (*_LABELS, "method", "outcome"),
)


def continued(deployment: DeploymentID, method: str, outcome: str) -> None:
    CONTINUATIONS.inc(deployment.app, deployment.name, _caller[0], method, outcome)
