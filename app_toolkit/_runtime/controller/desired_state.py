"""Changes to the controller's desired state (its applications and their deployments):
an application's new spec, its removal, the retirement of deployments no longer wanted;
the checkpoint of that state, and taking it back after a restart (the checkpoint, then
the replicas the previous controller left running)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from app_toolkit._runtime.controller import checkpoint, teardown
from app_toolkit._runtime.controller.api import ConfigFile
from app_toolkit._runtime.controller.backend import Backend
from app_toolkit._runtime.controller.capacity import Capacity
from app_toolkit._runtime.controller.custom_scaling import CustomScaling
from app_toolkit._runtime.controller.deployment_state import (
    DeploymentState,
    Lifecycle,
    adopt,
    follow_autoscaling,
    keep_size,
    new_spec,
    set_capacity,
)
from app_toolkit._runtime.controller.longpoll import LongPollHost
from app_toolkit._runtime.controller.publishing import TablePublisher
from app_toolkit._runtime.controller.traffic import TrafficPolicy
from app_toolkit._runtime.messages import AppSpec, DeploymentID
from app_toolkit._runtime.tables import DeploymentGone, replicas_key

logger = logging.getLogger("app_toolkit.controller")


class Records(Protocol):
    """What the controller keeps that its desired state is made of, or follows it."""

    backend: Backend[Any]
    apps: dict[str, AppSpec]
    applied_file: ConfigFile | None
    capacity: Capacity
    deployments: dict[DeploymentID, DeploymentState]
    policy: TrafficPolicy
    longpoll: LongPollHost
    tables: TablePublisher
    custom: CustomScaling


class DesiredState:
    """Changes one controller's desired state and checkpoints it."""

    def __init__(self, records: Records, due: dict[DeploymentID, float]) -> None:
        self._records = records
        # The controller's plan times (``next_due``): a deployment changed here loses
        # its entry, so it is planned on the next pass.
        self._due = due
        self._saved: dict[DeploymentID, Lifecycle] = {}  # the lifecycles last checkpointed

    async def restore(self) -> None:
        """Take back the checkpointed desired state, then the replicas still running."""
        records = self._records
        saved = checkpoint.loads(await records.backend.load_checkpoint())
        if saved is not None:
            records.applied_file, records.capacity = saved.applied_file, saved.capacity
            records.policy = TrafficPolicy(*saved.policy)
            in_file = saved.in_file()
            for spec in saved.apps.values():
                self.adopt(spec, records.capacity if spec.name in in_file else None)
            for deployment_id, lifecycle in saved.lifecycles.items():
                if deployment_id in records.deployments:
                    records.deployments[deployment_id].restore(lifecycle)
            self._saved = saved.lifecycles
            logger.info("Restored %d application(s) from the checkpoint", len(records.apps))
        await self._adopt_running_replicas()

    def replace_app(self, spec: AppSpec, capacity: Capacity | None = None) -> None:
        records = self._records
        previous = records.apps.get(spec.name)
        if previous is not None and previous.autoscaling_policy != spec.autoscaling_policy:
            records.custom.forget(spec.name)  # the old policy's call under way is not taken
        self.adopt(spec, capacity)
        if previous is not None:
            kept = {d.id for d in spec.deployments}
            for old in previous.deployments:
                if old.id not in kept:
                    self.retire(old.id, callers=teardown.callers_of(previous, old.id))

    def remove_app(self, name: str, hurry: bool = False) -> None:
        records = self._records
        app = records.apps.pop(name)
        records.custom.forget(name)
        for spec in app.deployments:
            self.retire(spec.id, hurry, frozenset() if hurry else teardown.callers_of(app, spec.id))
        if hurry:  # deployments an upgrade dropped that still wait for their callers go too
            for deployment, state in list(records.deployments.items()):
                if deployment.app == name and state.retire_after:
                    self.retire(deployment, hurry)
        records.policy.app_removed(name)

    def forget_config_of(self, name: str) -> None:
        """An app changed by hand no longer runs what the config file says (nor at its
        target capacity)."""
        records = self._records
        app = records.apps.get(name)
        for spec in app.deployments if app is not None else ():
            state = records.deployments.get(spec.id)
            if state is not None:
                set_capacity(state, Capacity())
        if records.applied_file is None:
            return
        apps = [
            app for app in records.applied_file.get("applications", []) if app.get("name", "default") != name
        ]
        records.applied_file = {**records.applied_file, "applications": apps} if apps else None

    def adopt(self, spec: AppSpec, capacity: Capacity | None = None) -> None:
        """Make ``spec`` the desired state of its application (at ``capacity``: a config
        file's; None: the capacity its deployments have, or none for new ones)."""
        records = self._records
        records.apps[spec.name] = spec
        now = asyncio.get_running_loop().time()
        for dep in spec.deployments:
            state = records.deployments.get(dep.id)
            if state is None or state.deleting:
                replicas = state.replicas if state is not None else {}
                state = records.deployments[dep.id] = DeploymentState(dep, replicas)
            elif state.spec != dep:
                new_spec(state, dep, now)
            set_capacity(state, capacity if capacity is not None else state.capacity)
            follow_autoscaling(state)
            self._due.pop(dep.id, None)
            records.tables.replicas(dep.id)

    async def _adopt_running_replicas(self) -> None:
        """Take over the replicas a previous controller left running: callers keep their
        connections and nothing restarts. Replicas of deployments no longer wanted stop."""
        records = self._records
        now = asyncio.get_running_loop().time()
        adopted = 0
        for found in await records.backend.find_replicas():
            state = records.deployments.get(found.info.deployment)
            if state is None or state.deleting:
                await records.backend.stop_replica(found.handle, graceful=True)
                continue
            adopt(state, found, now)
            adopted += 1
        for deployment_id, state in records.deployments.items():
            keep_size(state)  # the size the previous life chose
            records.tables.replicas(deployment_id)
        if adopted:
            logger.info("Adopted %d running replica(s)", adopted)

    def retire(
        self, deployment: DeploymentID, hurry: bool = False, callers: frozenset[DeploymentID] = frozenset()
    ) -> None:
        """Delete ``deployment``, once no replica of ``callers`` may call it (teardown.py)."""
        state = self._records.deployments.get(deployment)
        if state is not None:
            state.deleting, state.hurried, state.retire_after = True, hurry, callers
            self._due.pop(deployment, None)
            if not callers:
                self._records.longpoll.publish(replicas_key(deployment), DeploymentGone())

    async def checkpoint(self) -> None:
        records = self._records
        self._saved = self._lifecycles()
        saved = checkpoint.Checkpoint(
            records.apps, records.applied_file, records.capacity, self._saved, records.policy.saved()
        )
        await records.backend.save_checkpoint(saved.dumps())

    def unsaved(self) -> bool:
        """Whether a lifecycle changed since the last checkpoint (a version failed, an
        upgrade began or ended)."""
        return self._lifecycles() != self._saved

    def _lifecycles(self) -> dict[DeploymentID, Lifecycle]:
        return {
            deployment_id: state.lifecycle()
            for deployment_id, state in self._records.deployments.items()
            if not state.deleting
        }
