"""What the controller records: replicas wanted and running per deployment, the
autoscaler's last decision, and replica lifecycle events (starts, failed starts, failed
health checks, replacements)."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Protocol

from app_toolkit import metrics
from app_toolkit._runtime.controller.autoscaling import Decision
from app_toolkit._runtime.controller.deployment_state import DeploymentState
from app_toolkit._runtime.messages import DeploymentID

_DEPLOYMENT = ("application", "deployment")

STARTS = metrics.Counter("app_toolkit_replica_starts_total", "Replicas that started and ran", _DEPLOYMENT)
START_FAILURES = metrics.Counter(
    "app_toolkit_replica_start_failures_total",
    "Replica starts that failed (constructor, resources)",
    _DEPLOYMENT,
)
HEALTH_FAILURES = metrics.Counter(
    "app_toolkit_health_check_failures_total", "Health checks a replica failed or did not answer", _DEPLOYMENT
)
REPLACEMENTS = metrics.Counter(
    "app_toolkit_replica_replacements_total",
    "Serving replicas stopped because they failed, to be replaced (reason: gone, hung, "
    "unhealthy, reconfigure_failed)",
    (*_DEPLOYMENT, "reason"),
)

RECONCILE = metrics.Histogram(
    "app_toolkit_controller_reconcile_seconds",
    "Time of one pass of the controller's reconcile loop (autoscaling, planning each "
    "deployment with something due)",
)


class _Core(Protocol):
    @property
    def deployments(self) -> dict[DeploymentID, DeploymentState]: ...


_cores: weakref.WeakSet[_Core] = weakref.WeakSet()


def _states() -> Iterable[tuple[DeploymentID, DeploymentState]]:
    for core in list(_cores):
        yield from list(core.deployments.items())


def _target() -> dict[tuple[str, ...], float]:
    return {(d.app, d.name): float(state.target) for d, state in _states() if not state.deleting}


def _replicas() -> dict[tuple[str, ...], float]:
    counts: dict[tuple[str, ...], float] = {}
    for deployment, state in _states():
        for replica in state.replicas.values():
            key = (deployment.app, deployment.name, replica.state.value)
            counts[key] = counts.get(key, 0.0) + 1
    return counts


def _decisions() -> Iterable[tuple[DeploymentID, Decision]]:
    for deployment, state in _states():
        decision = state.autoscaler.last_decision if state.autoscaler is not None else None
        if decision is not None:
            yield deployment, decision


def _last_target() -> dict[tuple[str, ...], float]:
    return {
        (d.app, d.name, "up" if decision.to_replicas > decision.from_replicas else "down"): float(
            decision.to_replicas
        )
        for d, decision in _decisions()
    }


def _last_load() -> dict[tuple[str, ...], float]:
    return {(d.app, d.name): decision.load for d, decision in _decisions()}


TARGET = metrics.Gauge(
    "app_toolkit_deployment_target_replicas",
    "Replicas a deployment should have now (the autoscaler's target, else num_replicas)",
    _DEPLOYMENT,
    read=_target,
)
REPLICAS = metrics.Gauge(
    "app_toolkit_deployment_replicas",
    "Replicas of a deployment, by state",
    (*_DEPLOYMENT, "state"),
    read=_replicas,
)
LAST_DECISION = metrics.Gauge(
    "app_toolkit_autoscaler_last_decision_replicas",
    "The target the autoscaler's last decision set, and which way it went",
    (*_DEPLOYMENT, "direction"),
    read=_last_target,
)
LAST_LOAD = metrics.Gauge(
    "app_toolkit_autoscaler_last_decision_load",
    "The averaged load (requests queued and running) behind the autoscaler's last decision",
    _DEPLOYMENT,
    read=_last_load,
)


def track(core: _Core) -> None:
    """Report ``core``'s deployments while it lives."""
    _cores.add(core)
