"""What ``status()`` returns: applications → deployments → replicas, with states."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class ApplicationStatus(str, Enum):
    """Lifecycle of an application."""

    DEPLOYING = "DEPLOYING"
    RUNNING = "RUNNING"
    DEPLOY_FAILED = "DEPLOY_FAILED"
    DELETING = "DELETING"


class DeploymentStatus(str, Enum):
    """Lifecycle of a deployment."""

    UPDATING = "UPDATING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DEPLOY_FAILED = "DEPLOY_FAILED"


class ReplicaState(str, Enum):
    """Lifecycle of a replica."""

    STARTING = "STARTING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"


@dataclass(frozen=True)
class ReplicaStatusInfo:
    """One replica."""

    replica_id: str
    state: ReplicaState
    code_version: str


@dataclass(frozen=True)
class AutoscalingStatusInfo:
    """Why an autoscaled deployment has the target it has."""

    current_load: float  # requests queued + running now, over all callers
    average_load: float  # over look_back_period_s: what decisions use
    last_decision_load: float | None  # the averaged load behind the last change of target
    last_decision_from: int | None
    last_decision_to: int | None
    last_decision_age_s: float | None  # seconds since that change


@dataclass(frozen=True)
class DeploymentStatusInfo:
    """One deployment and its replicas."""

    name: str
    status: DeploymentStatus
    message: str
    target_replicas: int
    replicas: list[ReplicaStatusInfo] = field(default_factory=list)
    autoscaling: AutoscalingStatusInfo | None = None  # None unless autoscaled

    @property
    def running_replicas(self) -> int:
        return sum(1 for replica in self.replicas if replica.state is ReplicaState.RUNNING)

    @property
    def replica_states(self) -> dict[str, int]:
        """Count of replicas per state, e.g. ``{"RUNNING": 2}``."""
        counts: dict[str, int] = {}
        for replica in self.replicas:
            counts[replica.state.value] = counts.get(replica.state.value, 0) + 1
        return counts


@dataclass(frozen=True)
class ApplicationStatusInfo:
    """One application and its deployments."""

    name: str
    status: ApplicationStatus
    message: str
    route_prefix: str | None
    ingress: str
    deployments: dict[str, DeploymentStatusInfo] = field(default_factory=dict)


@dataclass(frozen=True)
class ServeStatus:
    """Everything the controller runs."""

    applications: dict[str, ApplicationStatusInfo] = field(default_factory=dict)
    proxies: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (enums as their values)."""

        def plain(value: Any) -> Any:
            if isinstance(value, Enum):
                return value.value
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, list):
                return [plain(v) for v in value]
            return value

        data = plain(dataclasses.asdict(self))
        for app in data["applications"].values():
            for name, deployment in app["deployments"].items():
                deployment["replica_states"] = self.applications[app["name"]].deployments[
                    name
                ].replica_states
        return data  # type: ignore[no-any-return]
