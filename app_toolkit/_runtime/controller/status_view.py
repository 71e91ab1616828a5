"""What ``status()`` says, derived from the controller's records. Pure."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping

from app_toolkit._runtime.controller import upgrade
from app_toolkit._runtime.controller.deployment_state import DeploymentState, Draining, slow_start_message
from app_toolkit._runtime.controller.planning import census, options
from app_toolkit._runtime.controller.proxy_states import ProxyStates
from app_toolkit._runtime.controller.traffic import TrafficPolicy
from app_toolkit._runtime.messages import AppSpec, DeploymentID
from app_toolkit.status import (
    ApplicationStatus,
    ApplicationStatusInfo,
    AutoscalingStatusInfo,
    DeploymentStatus,
    DeploymentStatusInfo,
    EventInfo,
    ReplicaState,
    ReplicaStatusInfo,
    ServeStatus,
    UpgradeStatusInfo,
)


def deployment_status(
    state: DeploymentState, current_load: float, now: float, draining: Draining | None = None
) -> DeploymentStatusInfo:
    """What status() says of one deployment."""
    version = state.spec.code_version
    running = sum(
        1
        for r in state.replicas.values()
        if r.version == version and r.state is ReplicaState.RUNNING and not r.stop_requested
    )
    # Replicas of older code, or still taking new in-place options, are not done yet.
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
        message=state.message or _policy_problem(state) or slow_start_message(state, now),
        target_replicas=state.target,
        replicas=[
            ReplicaStatusInfo(
                r.replica_id,
                r.state,
                r.version,
                r.info.node_id if r.info else "",
                r.info.models if r.info else (),
                r.info.stats() if r.info else {},
            )
            for r in state.replicas.values()
        ],
        autoscaling=_autoscaling_status(state, current_load, now),
        upgrade=_upgrade_status(state, now, draining or {}),
    )


def _upgrade_status(state: DeploymentState, now: float, draining: Draining) -> UpgradeStatusInfo | None:
    record = state.upgrade
    if record is None:
        return None
    counted = census(state, draining)
    policy = options(state)
    target = counted.target
    if state.serving_spec is not state.spec:
        mode, fraction = "rollback", 0.0
    elif policy.ray_serve:
        mode, fraction = "rolling", policy.rolling_update_percentage or upgrade.DEFAULT_STEP
    else:
        mode, fraction = ("steps", upgrade.DEFAULT_STEP) if record.steps else ("surge", 0.0)
    size = upgrade.step_size(fraction, target) if fraction else 0
    steps = math.ceil(max(target, 1) / size) if size else 0
    return UpgradeStatusInfo(
        to_version=state.serving_spec.code_version,
        old_replicas=len(counted.old_running),
        new_replicas=len(counted.new_running),
        target_replicas=target,
        mode=mode,
        step=min(max(math.ceil(record.replaced / size), 1), steps) if size else 0,
        steps=steps,
        step_size=size,
        waiting_for=upgrade.waiting_for(counted),
        age_s=now - record.since,
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
        policy=scaler.policy,
        metrics=scaler.seen,
        latest_metrics=scaler.latest,
        last_decision_metrics=decision.metrics if decision else None,
    )


def _policy_problem(state: DeploymentState) -> str:
    """Why a custom autoscaling policy's decisions do not apply ("" when they do)."""
    return state.autoscaler.problem if state.autoscaler is not None else ""


def app_status(deployments: Iterable[DeploymentStatusInfo]) -> ApplicationStatus:
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
    proxies: ProxyStates,
    policy: TrafficPolicy,
    events: Iterable[EventInfo],
    spares: Mapping[str, int] | None = None,
    draining: Draining | None = None,
) -> ServeStatus:
    """What status() says: every application (deleting ones too) with its traffic, the
    proxies and the latest lifecycle events."""
    result = {}
    for name, app in apps.items():
        infos = {
            spec.id.name: deployment_status(deployments[spec.id], load_of(spec.id), now, draining)
            for spec in app.deployments
            if spec.id in deployments
        }
        for deployment, shares in policy.deployment_traffic(name).items():
            if deployment in infos:
                infos[deployment] = dataclasses.replace(infos[deployment], traffic=shares)
        traffic, rollout, shadow = policy.status(name, now)
        result[name] = ApplicationStatusInfo(
            name=name,
            status=app_status(infos.values()),
            message="; ".join(f"{d.name}: {d.message}" for d in infos.values() if d.message),
            route_prefix=app.route_prefix,
            ingress=app.ingress,
            deployments=infos,
            traffic=traffic,
            rollout=rollout,
            shadow=shadow,
        )
    for name in {d.app for d in deployments if d.app not in apps}:
        result[name] = ApplicationStatusInfo(name, ApplicationStatus.DELETING, "", None, "")
    return ServeStatus(
        applications=result,
        proxies=proxies.statuses(),
        proxy_urls=proxies.urls(),
        events=list(events),
        spare_replicas=dict(spares or {}),
        draining_nodes=sorted(draining or {}),
    )
