"""The order in which an application's deployments go (pure): callers before the
deployments they call.

A replica that stops may still call its application's other deployments — a multiplexed
model's release, a ``__del__``, a lifespan shutdown, the last requests of its drain. So a
deployment that is deleted (with its application, or dropped by a new version of it)
keeps serving until the replicas that may call it are gone: those of the deployments
listed after it in the application's spec (``build.py`` lists every deployment after the
ones it binds, so its callers are among them), while they are being deleted too or are
replicas of an older version. A shutdown deletes everything at once (it hurries).

Limits: while it waits, the deployment is neither health-checked nor replaced nor shown in
``status()`` (it belongs to no application's spec any more), and the wait is not
checkpointed: a controller that restarts meanwhile stops its replicas at once. A dropped
deployment whose caller's upgrade failed (its old version serving on) waits until the
application is deployed or deleted again.
"""

from __future__ import annotations

from collections.abc import Mapping

from app_toolkit._runtime.controller.deployment_state import DeploymentState
from app_toolkit._runtime.messages import AppSpec, DeploymentID


def callers_of(app: AppSpec, deployment: DeploymentID) -> frozenset[DeploymentID]:
    """The deployments of ``app`` that may call ``deployment``: those bound after it."""
    ids = [spec.id for spec in app.deployments]
    return frozenset(ids[ids.index(deployment) + 1 :]) if deployment in ids else frozenset()


def callers_remain(state: DeploymentState, deployments: Mapping[DeploymentID, DeploymentState]) -> bool:
    """Whether a replica that may call the deleted ``state`` still runs: one of a caller
    being deleted too, or of a caller's older version (an upgrade's old replicas)."""
    for caller in state.retire_after:
        other = deployments.get(caller)
        if other is None:
            continue
        version = other.spec.code_version
        if any(other.deleting or replica.version != version for replica in other.replicas.values()):
            return True
    return False
