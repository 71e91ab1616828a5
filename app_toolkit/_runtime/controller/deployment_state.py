"""The controller's record of each deployment: replicas, target, and what status() says.

Pure (no I/O, no clock): the controller changes these records and derives status from them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app_toolkit._runtime.controller.autoscaling import Autoscaler
from app_toolkit._runtime.messages import AppSpec, DeploymentID, DeploymentSpec, ReplicaInfo
from app_toolkit.config import DeploymentConfig
from app_toolkit.status import (
    ApplicationStatus,
    ApplicationStatusInfo,
    AutoscalingStatusInfo,
    DeploymentStatus,
    DeploymentStatusInfo,
    ReplicaState,
    ReplicaStatusInfo,
    ServeStatus,
)

#: A replica starting for longer than this is reported in status() and logged.
SLOW_START_S = 30.0


@dataclass
class Replica:
    """What the controller knows of one replica."""

    replica_id: str
    version: str
    state: ReplicaState = ReplicaState.STARTING
    info: ReplicaInfo | None = None
    handle: Any = None
    stop_requested: bool = False
    next_health_check: float = 0.0
    checking: bool = False
    health_failures: int = 0
    config: DeploymentConfig | None = None  # the options the replica runs with
    reconfiguring: bool = False
    launched_at: float = 0.0  # controller clock
    slow_start_logged: bool = False


@dataclass
class DeploymentState:
    """What the controller knows of one deployment: its spec, replicas and target."""

    spec: DeploymentSpec
    replicas: dict[str, Replica] = field(default_factory=dict)
    start_failures: int = 0
    message: str = ""
    failed: bool = False
    deleting: bool = False
    ever_ran: bool = False  # a replica of this deployment has been RUNNING
    autoscaler: Autoscaler | None = None

    @property
    def target(self) -> int:
        """Replicas wanted now: the autoscaler's target, else num_replicas."""
        if self.autoscaler is not None:
            return self.autoscaler.target
        return self.spec.config.num_replicas


def follow_autoscaling(state: DeploymentState) -> None:
    """Start, keep, retune or drop the deployment's autoscaler for its (new) spec."""
    config = state.spec.config.autoscaling_config
    if config is None:
        state.autoscaler = None
    elif state.autoscaler is None:
        state.autoscaler = Autoscaler.start(config)
        keep_size(state)  # taking over a running deployment
    elif state.autoscaler.config != config:
        state.autoscaler = Autoscaler(config, state.autoscaler.target)
        state.autoscaler.hold(state.autoscaler.target)


def keep_size(state: DeploymentState) -> None:
    """An autoscaled deployment that already has replicas keeps that many (within its
    bounds) instead of starting over from initial_replicas."""
    running = sum(1 for r in state.replicas.values() if not r.stop_requested)
    if state.autoscaler is not None and running:
        state.autoscaler.hold(running)


def deployment_status(state: DeploymentState, current_load: float, now: float) -> DeploymentStatusInfo:
    """What status() says of one deployment."""
    version = state.spec.code_version
    running = sum(
        1
        for r in state.replicas.values()
        if r.version == version and r.state is ReplicaState.RUNNING and not r.stop_requested
    )
    # Replicas of older code, or still taking new light options, are not done yet.
    outdated = any(
        r.version != version or (r.config is not None and r.config != state.spec.config)
        for r in state.replicas.values()
    )
    if state.failed:
        status = DeploymentStatus.DEPLOY_FAILED
    elif running >= state.target and not outdated:
        status = DeploymentStatus.HEALTHY
    else:
        status = DeploymentStatus.UPDATING
    return DeploymentStatusInfo(
        name=state.spec.id.name,
        status=status,
        message=state.message or slow_start_message(state, now),
        target_replicas=state.target,
        replicas=[
            ReplicaStatusInfo(r.replica_id, r.state, r.version, r.info.node_id if r.info else "")
            for r in state.replicas.values()
        ],
        autoscaling=_autoscaling_status(state, current_load, now),
    )


def slow_starters(state: DeploymentState, now: float) -> list[Replica]:
    """Replicas that have been starting for longer than ``SLOW_START_S``."""
    return [
        r
        for r in state.replicas.values()
        if r.state is ReplicaState.STARTING and not r.stop_requested and now - r.launched_at > SLOW_START_S
    ]


def slow_start_message(state: DeploymentState, now: float) -> str:
    """Why replicas may be slow to start, naming what each one asks the cluster for."""
    slow = slow_starters(state, now)
    if not slow:
        return ""
    asks = state.spec.config.ray_actor_options.model_dump(exclude_defaults=True, exclude={"runtime_env"})
    needs = ", ".join(f"{key}={value}" for key, value in asks.items()) or "no reserved resources"
    return (
        f"{len(slow)} replica(s) starting for more than {SLOW_START_S:.0f} s: the cluster may "
        f"not have room for one (each needs {needs}), a runtime_env may be installing, or "
        "the constructor is slow. Replicas already running keep serving."
    )


def _autoscaling_status(
    state: DeploymentState, current_load: float, now: float
) -> AutoscalingStatusInfo | None:
    scaler = state.autoscaler
    if scaler is None:
        return None
    decision = scaler.last_decision
    return AutoscalingStatusInfo(
        current_load=current_load,
        average_load=scaler.average_load(),
        last_decision_load=decision.load if decision else None,
        last_decision_from=decision.from_replicas if decision else None,
        last_decision_to=decision.to_replicas if decision else None,
        last_decision_age_s=now - decision.at if decision else None,
    )


def app_status(deployments: Any) -> ApplicationStatus:
    """An application's status from its deployments' statuses."""
    statuses = [d.status for d in deployments]
    if any(s is DeploymentStatus.DEPLOY_FAILED for s in statuses):
        return ApplicationStatus.DEPLOY_FAILED
    if statuses and all(s is DeploymentStatus.HEALTHY for s in statuses):
        return ApplicationStatus.RUNNING
    return ApplicationStatus.DEPLOYING


def serve_status(
    apps: Mapping[str, AppSpec],
    deployments: Mapping[DeploymentID, DeploymentState],
    load_of: Callable[[DeploymentID], float],
    now: float,
    proxies: Mapping[str, str],
) -> ServeStatus:
    """What status() says: every application (deleting ones too) and the proxies."""
    result = {}
    for name, app in apps.items():
        infos = {
            spec.id.name: deployment_status(deployments[spec.id], load_of(spec.id), now)
            for spec in app.deployments
            if spec.id in deployments
        }
        result[name] = ApplicationStatusInfo(
            name=name,
            status=app_status(infos.values()),
            message="; ".join(f"{d.name}: {d.message}" for d in infos.values() if d.message),
            route_prefix=app.route_prefix,
            ingress=app.ingress,
            deployments=infos,
        )
    for name in {d.app for d in deployments if d.app not in apps}:
        result[name] = ApplicationStatusInfo(name, ApplicationStatus.DELETING, "", None, "")
    return ServeStatus(applications=result, proxies=dict(proxies))
