"""The controller: desired state → reconcile loop → replicas, tables for callers.

Backend-independent (the Ray actor and the local backend wrap a ``ControllerCore``). A
deploy is acknowledged only after the desired state is checkpointed. The loop catches,
logs and continues; it never dies on an error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import pickle
import secrets
from typing import Any

from app_toolkit._runtime.backends.base import Backend
from app_toolkit._runtime.controller.deployment_state import (
    DeploymentState,
    Replica,
    follow_autoscaling,
    keep_size,
    serve_status,
    slow_start_message,
    slow_starters,
)
from app_toolkit._runtime.controller.longpoll import LongPollHost
from app_toolkit._runtime.controller.prefixes import check_prefixes
from app_toolkit._runtime.messages import AppSpec, DeploymentID, DeploymentSpec, RouteInfo
from app_toolkit._runtime.tables import (
    ROUTES_KEY,
    DeploymentGone,
    Loads,
    ReplicaTable,
    RouteTable,
    Updates,
    Versions,
    replicas_key,
)
from app_toolkit.config import DeploymentConfig
from app_toolkit.exceptions import ReplicaUnavailableError
from app_toolkit.status import ReplicaState, ServeStatus

logger = logging.getLogger("app_toolkit.controller")

MAX_START_FAILURES = 3
_LOOP_PERIOD_S = 0.1
#: A caller's load report counts for this long (callers repeat non-zero loads every
#: ~2 s), so a caller that died does not hold replicas up forever.
LOAD_REPORT_TTL_S = 10.0


class ControllerCore:
    """Holds desired and actual state and drives one toward the other."""

    def __init__(self, backend: Backend[Any]) -> None:
        self.backend = backend
        self.apps: dict[str, AppSpec] = {}
        self.deployments: dict[DeploymentID, DeploymentState] = {}
        self.longpoll = LongPollHost()
        self.proxies: dict[str, str] = {}
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # caller id -> (time of report, load per deployment): requests queued + running.
        self._loads: dict[str, tuple[float, Loads]] = {}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        data = await self.backend.load_checkpoint()
        if data:
            for spec in pickle.loads(data).values():
                self._adopt(spec)
            logger.info("Restored %d application(s) from the checkpoint", len(self.apps))
        await self._adopt_running_replicas()
        self._publish_routes()
        self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
        for task in list(self._tasks):
            task.cancel()

    # ------------------------------------------------------------------ API

    async def deploy_app(self, spec: AppSpec) -> None:
        """Record the new desired state, checkpoint it, then acknowledge."""
        for other in self.apps.values():
            if other.name != spec.name:
                check_prefixes(spec, other)
        previous = self.apps.get(spec.name)
        self._adopt(spec)
        if previous is not None:
            kept = {d.id for d in spec.deployments}
            for old in previous.deployments:
                if old.id not in kept:
                    self._retire(old.id)
        await self._checkpoint()
        self._publish_routes()
        self._wake.set()

    async def delete_app(self, name: str) -> None:
        app = self.apps.pop(name, None)
        if app is None:
            return
        await self._checkpoint()
        for spec in app.deployments:
            self._retire(spec.id)
        self._publish_routes()
        self._wake.set()

    def record_load(self, caller: str, loads: Loads) -> None:
        """A caller's newest load per deployment (requests queued + running)."""
        self._loads[caller] = (asyncio.get_running_loop().time(), loads)
        for deployment, load in loads.items():
            state = self.deployments.get(deployment)
            if load and state is not None and state.autoscaler is not None and state.target == 0:
                self._wake.set()  # demand at zero replicas: scale up now, not next tick

    def _current_load(self, deployment: DeploymentID, now: float) -> float:
        total = 0.0
        for caller, (at, loads) in list(self._loads.items()):
            if now - at > LOAD_REPORT_TTL_S:
                del self._loads[caller]
                continue
            total += loads.get(deployment, 0.0)
        return total

    def app_exists(self, name: str) -> bool:
        return name in self.apps or any(d.app == name for d in self.deployments)

    async def listen(self, known: Versions, timeout_s: float) -> Updates:
        return await self.longpoll.listen(known, timeout_s)

    def status(self) -> ServeStatus:
        now = asyncio.get_running_loop().time()
        return serve_status(
            self.apps, self.deployments, lambda d: self._current_load(d, now), now, self.proxies
        )

    # ------------------------------------------------------------------ desired state

    def _adopt(self, spec: AppSpec) -> None:
        self.apps[spec.name] = spec
        for dep in spec.deployments:
            state = self.deployments.get(dep.id)
            if state is None or state.deleting:
                replicas = state.replicas if state is not None else {}
                state = self.deployments[dep.id] = DeploymentState(dep, replicas)
            elif state.spec != dep:
                if state.spec.code_version != dep.code_version:
                    state.start_failures, state.failed, state.message = 0, False, ""
                state.spec = dep
            follow_autoscaling(state)
            self._publish_replicas(dep.id)

    async def _adopt_running_replicas(self) -> None:
        """Take over the replicas a previous controller left running: callers keep their
        connections and nothing restarts. Replicas of deployments no longer wanted stop."""
        now = asyncio.get_running_loop().time()
        adopted = 0
        for found in await self.backend.find_replicas():
            state = self.deployments.get(found.info.deployment)
            if state is None or state.deleting:
                await self.backend.stop_replica(found.handle, graceful=True)
                continue
            state.replicas[found.info.replica_id] = Replica(
                found.info.replica_id,
                found.code_version,
                ReplicaState.RUNNING,
                found.info,
                found.handle,
                next_health_check=now + state.spec.config.health_check_period_s,
                config=found.config,
            )
            state.ever_ran = True
            adopted += 1
        for deployment_id, state in self.deployments.items():
            keep_size(state)  # the size the previous life chose
            self._publish_replicas(deployment_id)
        if adopted:
            logger.info("Adopted %d running replica(s)", adopted)

    def _retire(self, deployment: DeploymentID) -> None:
        state = self.deployments.get(deployment)
        if state is not None:
            state.deleting = True
            self.longpoll.publish(replicas_key(deployment), DeploymentGone())

    async def _checkpoint(self) -> None:
        await self.backend.save_checkpoint(pickle.dumps(self.apps))

    # ------------------------------------------------------------------ reconcile

    async def _run(self) -> None:
        while True:
            try:
                self._reconcile()
            except Exception:
                logger.exception("Reconcile step failed; retrying")
            try:
                await asyncio.wait_for(self._wake.wait(), _LOOP_PERIOD_S)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    def _reconcile(self) -> None:
        now = asyncio.get_running_loop().time()
        for deployment_id, state in list(self.deployments.items()):
            if state.deleting:
                for replica in list(state.replicas.values()):
                    self._stop(state, replica)
                if not state.replicas:
                    del self.deployments[deployment_id]
                continue
            if state.autoscaler is not None:
                load = self._current_load(deployment_id, now)
                state.autoscaler.record(now, load)
                before = state.autoscaler.target
                after = state.autoscaler.step(now, load)
                if after != before:
                    logger.info(
                        "%s: %d -> %d replicas for an average load of %.1f",
                        deployment_id,
                        before,
                        after,
                        state.autoscaler.average_load(),
                    )
            self._scale(state)
            self._reconfigure(state)
            self._check_health(state, now)
            for replica in slow_starters(state, now):
                if not replica.slow_start_logged:
                    replica.slow_start_logged = True
                    logger.warning("%s: %s", deployment_id, slow_start_message(state, now))

    def _scale(self, state: DeploymentState) -> None:
        target = state.target
        version = state.spec.code_version
        current = [r for r in state.replicas.values() if r.version == version and not r.stop_requested]
        outdated = [r for r in state.replicas.values() if r.version != version and not r.stop_requested]
        if len(current) < target and not state.failed:
            for _ in range(target - len(current)):
                self._launch(state)
        elif len(current) > target:
            # Replicas still starting go first: they serve nothing yet.
            current.sort(key=lambda r: r.state is ReplicaState.RUNNING)
            for replica in current[: len(current) - target]:
                self._stop(state, replica)
        running = sum(1 for r in current if r.state is ReplicaState.RUNNING)
        if running >= target and not state.failed:
            # Only once the new version is fully up do the old replicas go (a failed
            # rollout keeps them serving).
            for replica in outdated:
                self._stop(state, replica)

    def _reconfigure(self, state: DeploymentState) -> None:
        """Running replicas of the current code take changed light options in place."""
        spec = state.spec
        for replica in state.replicas.values():
            if (
                replica.state is ReplicaState.RUNNING
                and not replica.stop_requested
                and not replica.reconfiguring
                and replica.version == spec.code_version
                and replica.config != spec.config
            ):
                replica.reconfiguring = True
                self._spawn(self._reconfigure_replica(state, replica, spec.config))

    async def _reconfigure_replica(
        self, state: DeploymentState, replica: Replica, config: DeploymentConfig
    ) -> None:
        try:
            await self.backend.reconfigure_replica(replica.handle, config)
        except Exception as exc:  # noqa: BLE001 - user code failed: replace the replica
            state.message = f"reconfigure() failed: {exc}"
            logger.warning("Replica %s could not be reconfigured (%s); replacing it", replica.replica_id, exc)
            self._stop(state, replica)
            return
        finally:
            replica.reconfiguring = False
            self._wake.set()
        replica.config = config
        if replica.info is not None and replica.info.max_ongoing_requests != config.max_ongoing_requests:
            replica.info = dataclasses.replace(replica.info, max_ongoing_requests=config.max_ongoing_requests)
            self._publish_replicas(state.spec.id)

    def _launch(self, state: DeploymentState) -> None:
        spec = state.spec
        replica_id = f"{spec.id.app}.{spec.id.name}.{secrets.token_hex(3)}"
        replica = Replica(replica_id, spec.code_version, launched_at=asyncio.get_running_loop().time())
        state.replicas[replica_id] = replica
        self._spawn(self._start_replica(state, replica, spec))

    async def _start_replica(self, state: DeploymentState, replica: Replica, spec: DeploymentSpec) -> None:
        try:
            info, handle = await self.backend.start_replica(replica.replica_id, spec)
        except Exception as exc:  # noqa: BLE001 - counted as a failed start, shown in status
            state.replicas.pop(replica.replica_id, None)
            if spec.code_version == state.spec.code_version:
                state.start_failures += 1
                state.message = f"Replica failed to start: {exc}"
                if state.start_failures >= MAX_START_FAILURES:
                    state.failed = True
                    logger.error("%s failed to deploy: %s", spec.id, exc)
                    if not any(r.state is ReplicaState.RUNNING for r in state.replicas.values()):
                        # Requests waiting for a first replica must fail, not wait forever.
                        self.longpoll.publish(replicas_key(spec.id), DeploymentGone())
            self._wake.set()
            return
        replica.info, replica.handle, replica.config = info, handle, spec.config
        if replica.stop_requested:
            await self.backend.stop_replica(handle, graceful=False)
            state.replicas.pop(replica.replica_id, None)
            return
        replica.state = ReplicaState.RUNNING
        state.ever_ran = True
        replica.next_health_check = asyncio.get_running_loop().time() + spec.config.health_check_period_s
        state.message = ""
        self._publish_replicas(spec.id)
        self._wake.set()

    def _stop(self, state: DeploymentState, replica: Replica) -> None:
        if replica.stop_requested:
            return
        replica.stop_requested = True
        if replica.state is ReplicaState.STARTING:
            return  # _start_replica stops it when its start finishes
        replica.state = ReplicaState.STOPPING
        self._publish_replicas(state.spec.id)
        self._spawn(self._stop_replica(state, replica))

    async def _stop_replica(self, state: DeploymentState, replica: Replica) -> None:
        try:
            await self.backend.stop_replica(replica.handle, graceful=True)
        finally:
            state.replicas.pop(replica.replica_id, None)
            self._wake.set()

    def _check_health(self, state: DeploymentState, now: float) -> None:
        config = state.spec.config
        for replica in list(state.replicas.values()):
            if replica.state is not ReplicaState.RUNNING or replica.checking:
                continue
            if replica.next_health_check > now:
                continue
            replica.checking = True
            self._spawn(self._health_check(state, replica, config.health_check_timeout_s))

    async def _health_check(self, state: DeploymentState, replica: Replica, timeout_s: float) -> None:
        try:
            await self.backend.check_health(replica.handle, timeout_s)
            replica.health_failures = 0
        except ReplicaUnavailableError as exc:
            logger.warning("Replica %s is gone (%s); replacing it", replica.replica_id, exc)
            replica.health_failures = state.spec.config.health_check_failure_threshold
        except Exception as exc:  # noqa: BLE001 - any failure counts against the threshold
            replica.health_failures += 1
            logger.warning("Health check of %s failed: %s", replica.replica_id, exc)
        finally:
            replica.checking = False
            loop = asyncio.get_running_loop()
            replica.next_health_check = loop.time() + state.spec.config.health_check_period_s
        threshold = state.spec.config.health_check_failure_threshold
        if replica.health_failures >= threshold and not replica.stop_requested:
            self._stop(state, replica)
            self._wake.set()

    # ------------------------------------------------------------------ tables

    def _publish_replicas(self, deployment: DeploymentID) -> None:
        state = self.deployments.get(deployment)
        if state is None or state.deleting:
            return
        infos = tuple(
            sorted(
                (
                    r.info
                    for r in state.replicas.values()
                    if r.state is ReplicaState.RUNNING and r.info is not None and not r.stop_requested
                ),
                key=lambda info: info.replica_id,
            )
        )
        # Until a first replica runs (a new deployment starting up), callers queue without a
        # bound: a request that arrives before its proxy has the new table waits for the
        # replica instead of being refused.
        max_queued = state.spec.config.max_queued_requests if state.ever_ran else -1
        self.longpoll.publish(replicas_key(deployment), ReplicaTable(infos, max_queued))

    def _publish_routes(self) -> None:
        routes = tuple(
            sorted(
                (
                    RouteInfo(app.route_prefix, app.name, DeploymentID(app.name, app.ingress), app.routes)
                    for app in self.apps.values()
                    if app.route_prefix is not None
                ),
                key=lambda route: route.route_prefix,
            )
        )
        self.longpoll.publish(ROUTES_KEY, RouteTable(routes))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
