"""What the dashboard shows, as JSON-ready data: the controller's status joined with the
node's metrics, and per route the request rate and p50/p99 latency since the previous
sample (from the proxy's cumulative histograms). Pure: no I/O, the clock is passed in."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TypedDict

from app_toolkit.metrics import FamilySnapshot, HistogramValue, quantile
from app_toolkit.status import ServeStatus

_DURATION = "app_toolkit_http_request_duration_seconds"
_ONGOING = "app_toolkit_replica_ongoing_requests"
_QUEUED = "app_toolkit_caller_queued_requests"

#: (application, route) -> its requests' latency histogram, merged over methods and statuses.
RouteKey = tuple[str, str]


class RouteRow(TypedDict):
    """One route's requests between two samples."""

    application: str
    route: str
    rate: float  # requests per second
    p50_ms: float | None  # None: no request in the window
    p99_ms: float | None
    total: int  # requests since the process started


class ReplicaRow(TypedDict):
    replica_id: str
    state: str
    node_id: str
    ongoing: float | None  # None: not on this node, so unknown (not zero)


class DeploymentRow(TypedDict):
    name: str
    status: str
    message: str
    target_replicas: int
    running_replicas: int
    queued: float
    autoscaling: dict[str, object] | None  # AutoscalingStatusInfo's fields
    upgrade: str  # the upgrade under way, in words ("" for none)
    replicas: list[ReplicaRow]


class ApplicationRow(TypedDict):
    name: str
    status: str
    message: str
    route_prefix: str | None
    deployments: list[DeploymentRow]


class DashboardState(TypedDict):
    """What one dashboard event carries (as JSON)."""

    time: float
    controller: str  # why the controller's status is missing ("" when it answered)
    applications: list[ApplicationRow]
    routes: list[RouteRow]
    events: list[dict[str, object]]  # EventInfo's fields


class RouteRates:
    """Request rate and latency per route between two samples of the HTTP histograms of
    the node's processes (the proxy's, and the ingress replicas' that serve connections)."""

    def __init__(self) -> None:
        self._last: dict[RouteKey, HistogramValue] = {}
        self._last_at: float | None = None

    def update(self, families: Iterable[FamilySnapshot], now: float) -> list[RouteRow]:
        current = _by_route(families)
        previous, previous_at = self._last, self._last_at
        self._last, self._last_at = current, now
        rows: list[RouteRow] = []
        for (app, route), value in sorted(current.items()):
            before = previous.get((app, route))
            if previous_at is None or now <= previous_at:
                window = _EMPTY
            else:
                window = _minus(value, before) if before is not None else value
            seconds = now - previous_at if previous_at is not None and now > previous_at else 0.0
            p50 = quantile(window.buckets, 0.5)
            p99 = quantile(window.buckets, 0.99)
            rows.append(
                {
                    "application": app,
                    "route": route,
                    "rate": window.count / seconds if seconds else 0.0,
                    "p50_ms": None if p50 is None else p50 * 1000,
                    "p99_ms": None if p99 is None else p99 * 1000,
                    "total": value.count,
                }
            )
        return rows


_EMPTY = HistogramValue((), 0, 0.0)


def _by_route(families: Iterable[FamilySnapshot]) -> dict[RouteKey, HistogramValue]:
    merged: dict[RouteKey, HistogramValue] = {}
    for family in families:
        if family.name != _DURATION:
            continue
        app_at, route_at = family.labelnames.index("application"), family.labelnames.index("route")
        for labels, value in family.samples:
            if not isinstance(value, HistogramValue) or not labels[app_at]:
                continue  # the proxy's own pages (/-/...) are not an application's routes
            key = (labels[app_at], labels[route_at])
            known = merged.get(key)
            merged[key] = value if known is None else _plus(known, value)
    return merged


def _plus(a: HistogramValue, b: HistogramValue) -> HistogramValue:
    buckets = tuple((bound, x + y) for (bound, x), (_, y) in zip(a.buckets, b.buckets, strict=True))
    return HistogramValue(buckets, a.count + b.count, a.sum + b.sum)


def _minus(a: HistogramValue, b: HistogramValue) -> HistogramValue:
    if b.count > a.count or len(a.buckets) != len(b.buckets):
        return a  # the counts restarted (a new proxy process): all of a is new
    buckets = tuple((bound, x - y) for (bound, x), (_, y) in zip(a.buckets, b.buckets, strict=True))
    return HistogramValue(buckets, a.count - b.count, a.sum - b.sum)


def _gauge(
    processes: Iterable[Iterable[FamilySnapshot]], name: str, *keys: str
) -> dict[tuple[str, ...], float]:
    """Sum of a gauge's samples per value of ``keys`` over all processes."""
    totals: dict[tuple[str, ...], float] = {}
    for families in processes:
        for family in families:
            if family.name != name:
                continue
            at = [family.labelnames.index(key) for key in keys]
            for labels, value in family.samples:
                if isinstance(value, float | int):
                    key = tuple(labels[i] for i in at)
                    totals[key] = totals.get(key, 0.0) + float(value)
    return totals


def view(
    status: ServeStatus | None,
    processes: Sequence[Sequence[FamilySnapshot]],
    routes: list[RouteRow],
    now: float,
    status_error: str = "",
) -> DashboardState:
    """The dashboard's state: applications (deployments, replicas with ongoing requests
    where this node's metrics know them, queue lengths at this node's callers), routes,
    the controller's recent events. ``status`` None: the controller did not answer."""
    ongoing = _gauge(processes, _ONGOING, "replica")
    queued = _gauge(processes, _QUEUED, "application", "deployment")
    applications: list[ApplicationRow] = []
    for app in status.applications.values() if status is not None else ():
        deployments: list[DeploymentRow] = []
        for deployment in app.deployments.values():
            replicas: list[ReplicaRow] = [
                {
                    "replica_id": replica.replica_id,
                    "state": replica.state.value,
                    "node_id": replica.node_id,
                    "ongoing": ongoing.get((replica.replica_id,)),
                }
                for replica in deployment.replicas
            ]
            scaling = deployment.autoscaling
            deployments.append(
                {
                    "name": deployment.name,
                    "status": deployment.status.value,
                    "message": deployment.message,
                    "target_replicas": deployment.target_replicas,
                    "running_replicas": deployment.running_replicas,
                    "queued": queued.get((app.name, deployment.name), 0.0),
                    "autoscaling": dataclasses.asdict(scaling) if scaling is not None else None,
                    "upgrade": deployment.upgrade.describe() if deployment.upgrade is not None else "",
                    "replicas": replicas,
                }
            )
        applications.append(
            {
                "name": app.name,
                "status": app.status.value,
                "message": app.message,
                "route_prefix": app.route_prefix,
                "deployments": deployments,
            }
        )
    return {
        "time": now,
        "controller": "" if status is not None else (status_error or "the controller did not answer"),
        "applications": applications,
        "routes": routes,
        "events": [dataclasses.asdict(event) for event in (status.events if status is not None else ())],
    }
