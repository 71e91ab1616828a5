"""The controller's record of each deployment: replicas, target, and what status() says.

Pure (no I/O, no clock): the controller changes these records and derives status from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app_toolkit._runtime.autoscaling import Autoscaler
from app_toolkit._runtime.messages import DeploymentSpec, ReplicaInfo
from app_toolkit.config import DeploymentConfig
from app_toolkit.status import (
    ApplicationStatus,
    AutoscalingStatusInfo,
    DeploymentStatus,
    DeploymentStatusInfo,
    ReplicaState,
    ReplicaStatusInfo,
)


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
    outdated = any(r.version != version or (r.config is not None and r.config != state.spec.config)
                   for r in state.replicas.values())
    if state.failed:
        status = DeploymentStatus.DEPLOY_FAILED
    elif running >= state.target and not outdated:
        status = DeploymentStatus.HEALTHY
    else:
        status = DeploymentStatus.UPDATING
    return DeploymentStatusInfo(
        name=state.spec.id.name,
        status=status,
        message=state.message,
        target_replicas=state.target,
        replicas=[
            ReplicaStatusInfo(r.replica_id, r.state, r.version, r.info.node_id if r.info else "")
            for r in state.replicas.values()
        ],
        autoscaling=_autoscaling_status(state, current_load, now),
    )



def _autoscaling_status(state: DeploymentState, current_load: float,
                        now: float) -> AutoscalingStatusInfo | None:
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
