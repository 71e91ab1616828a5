"""The controller: desired state → reconcile loop → replicas, tables for callers.

A thin shell around pure transitions (``deployment_state.py``, ``replica_state.py``): it
feeds them events (a tick of the loop, the outcome of a backend call) and performs the
actions they return. Backend-independent (the Ray actor and the local backend wrap a
``ControllerCore``). A deploy is acknowledged only after the desired state is
checkpointed. The loop catches, logs and continues; it never dies on an error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from app_toolkit._runtime.controller import controller_metrics, teardown
from app_toolkit._runtime.controller.actions import ActionRunner
from app_toolkit._runtime.controller.api import ConfigFile
from app_toolkit._runtime.controller.backend import Backend
from app_toolkit._runtime.controller.capacity import Capacity, file_capacity
from app_toolkit._runtime.controller.cluster import ClusterWatch
from app_toolkit._runtime.controller.custom_scaling import CustomScaling
from app_toolkit._runtime.controller.deployment_state import (
    Action,
    DeploymentState,
    apply_event,
    autoscale,
    place,
)
from app_toolkit._runtime.controller.desired_state import DesiredState
from app_toolkit._runtime.controller.heap import HeapKeeper
from app_toolkit._runtime.controller.loads import LoadBook
from app_toolkit._runtime.controller.longpoll import LongPollHost
from app_toolkit._runtime.controller.planning import next_due, plan
from app_toolkit._runtime.controller.prefixes import check_all_prefixes
from app_toolkit._runtime.controller.proxy_states import ProxyStates
from app_toolkit._runtime.controller.publishing import TablePublisher
from app_toolkit._runtime.controller.replica_state import Event
from app_toolkit._runtime.controller.reports import ReportIntake
from app_toolkit._runtime.controller.rollout import new_rollout
from app_toolkit._runtime.controller.status_view import serve_status
from app_toolkit._runtime.controller.traffic import TrafficPolicy
from app_toolkit._runtime.messages import AppSpec, DeploymentID
from app_toolkit._runtime.quotas import Charges, QuotaAsk, QuotaGrant, QuotaLedger
from app_toolkit._runtime.request_context import ReplicaRank
from app_toolkit._runtime.tables import (
    APPLICATIONS_KEY,
    DeploymentGone,
    Loads,
    Outcomes,
    Updates,
    Versions,
    replicas_key,
)
from app_toolkit._runtime.waiting import wait_event
from app_toolkit.config import RolloutOptions
from app_toolkit.status import EventInfo, ServeStatus

logger = logging.getLogger("app_toolkit.controller")

_LOOP_PERIOD_S = 0.1
#: At shutdown, replicas get this long to drain before the controller stops anyway.
_SHUTDOWN_DRAIN_S = 60.0
#: How long a deploy or delete waits for the proxies to route by its application table.
_PROXIES_ROUTE_S = 5.0
#: A caller's load report counts for this long (callers repeat non-zero loads every
#: ~2 s), so a caller that died does not hold replicas up forever.
LOAD_REPORT_TTL_S = 10.0
#: Events status() shows (the newest).
EVENTS_KEPT = 50


class ControllerCore:
    """Holds desired and actual state and drives one toward the other."""

    def __init__(
        self,
        backend: Backend[Any],
        proxies: ProxyStates | None = None,
        heap: HeapKeeper | None = None,
        spares: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.backend = backend
        #: Node id -> spare replica processes ready there (the Ray backend's warm pool).
        self._spares = spares
        #: Freezes the heap once the deployments settle (controller/heap.py); only in a
        #: process of the controller's own: it changes how that whole process collects.
        self.heap = heap
        self.apps: dict[str, AppSpec] = {}
        #: The last config file applied (as written), less the apps changed since by hand.
        self.applied_file: ConfigFile | None = None
        self.deployments: dict[DeploymentID, DeploymentState] = {}
        self.longpoll = LongPollHost()
        #: The proxies (their status and URL), as the backend keeps them.
        self.proxies = proxies if proxies is not None else ProxyStates()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        #: Each caller's load per deployment (requests queued + running), summed.
        self.loads = LoadBook(LOAD_REPORT_TTL_S)
        # When each deployment next needs a plan() with no event before then
        # (``next_due``); one without an entry is planned on the next pass.
        self._due: dict[DeploymentID, float] = {}
        #: The latest log lines of the lifecycle (deploy errors, replacements, scaling).
        self.events: deque[EventInfo] = deque(maxlen=EVENTS_KEPT)
        #: Traffic splits, rollouts and shadows (controller/traffic.py).
        self.policy = TrafficPolicy()
        #: The config file's target_capacity (for the applications it deployed).
        self.capacity = Capacity()
        #: Builds and publishes the tables callers follow.
        self.tables = TablePublisher(self)
        #: Performs the actions the transitions return (controller/actions.py).
        self.actions = ActionRunner(
            backend, self.tables, self.longpoll, self._on, self._record, self._place, heap
        )
        #: Nodes that are leaving, and starts the cluster cannot place (controller/cluster.py).
        self.cluster = ClusterWatch(backend, self, self._record, self.actions.spawn)
        #: Custom autoscaling policies and replicas' custom metrics (controller/custom_scaling.py).
        self.custom = CustomScaling(backend.load_object)
        #: Changes to the applications and their deployments, checkpointed (controller/desired_state.py).
        self.desired = DesiredState(self, self._due)
        #: What callers and replicas report, taken where it counts (controller/reports.py).
        self.reports = ReportIntake(self, self._move_rollouts, self._wake.set)
        self.quotas = QuotaLedger(time.time)  # API keys' limits, for every front
        controller_metrics.track(self)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.desired.restore()
        self.tables.routes()
        self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def shutdown(self) -> None:
        """Stop serving: delete every application and wait (bounded) until their replicas
        stopped, forget the desired state, stop the proxies, then this controller's loop."""
        for name in list(self.apps):
            await self.delete_app(name, hurry=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _SHUTDOWN_DRAIN_S
        while self.deployments and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self.deployments:
            logger.warning("Shutting down with %d deployment(s) still stopping", len(self.deployments))
        await self.backend.save_checkpoint(b"")
        await self.backend.stop_proxies()
        await self.stop()

    async def stop(self) -> None:
        """Cancel the loop and every backend call under way, and wait for them; abandon
        the autoscaling policies' calls under way."""
        await self.actions.stop(*([self._loop_task] if self._loop_task is not None else []))
        self.custom.close()

    # ------------------------------------------------------------------ API

    async def deploy_apps(self, specs: list[AppSpec]) -> None:
        """Record the new desired state of these applications (their prefixes checked
        against each other's and the other running applications' first: all or none),
        checkpoint it, then acknowledge."""
        names = {spec.name for spec in specs}
        check_all_prefixes(specs, [other for other in self.apps.values() if other.name not in names])
        for spec in specs:
            self.desired.forget_config_of(spec.name)
            self.desired.replace_app(spec)
        await self._publish()

    async def delete_app(self, name: str, hurry: bool = False) -> None:
        """Delete an application; ``hurry`` (a shutdown): its replicas' streams and
        WebSockets end as their drain starts."""
        if name not in self.apps:
            return
        self.desired.forget_config_of(name)
        self.desired.remove_app(name, hurry)
        await self._publish(proxies_route=not hurry)  # a shutdown stops the proxies anyway

    async def apply_config(self, specs: list[AppSpec], config_file: ConfigFile) -> None:
        """Make the applications exactly ``specs`` (a config file's), all in one step:
        new ones start, changed ones update, the others are deleted."""
        check_all_prefixes(specs)
        wanted = {spec.name for spec in specs}
        capacity = file_capacity(self.applied_file, self.capacity, config_file)
        if capacity != self.capacity:
            self._record(logging.INFO, capacity.change_from(self.capacity))
        self.capacity = capacity
        for name in [name for name in self.apps if name not in wanted]:
            self.desired.remove_app(name)
        for spec in specs:
            self.desired.replace_app(spec, capacity)
        self.applied_file = config_file
        await self._publish()

    async def _publish(self, proxies_route: bool = True) -> None:
        """The applications changed: checkpoint, publish their routes and splits, wake the
        loop, and (``proxies_route``) wait for the proxies to route by them."""
        await self.desired.checkpoint()
        self.tables.routes()
        self.tables.splits()
        self._wake.set()
        if proxies_route:
            await self._proxies_route()

    async def _proxies_route(self) -> None:
        """Return once every proxy routes by the application table just published, so
        that a request sent when a deploy returns finds its routes (bounded: a proxy
        that lags or is gone is logged, not waited for)."""
        version = self.longpoll.version(APPLICATIONS_KEY)
        lagging = await self.backend.proxies_lagging(APPLICATIONS_KEY, version, _PROXIES_ROUTE_S)
        if lagging:
            logger.warning(
                "The proxies of %s do not have the new routes after %.0f s (or did not answer); "
                "they get them when they reach the controller",
                ", ".join(lagging),
                _PROXIES_ROUTE_S,
            )

    async def set_traffic(self, endpoint: str, weights: dict[str, float]) -> None:
        """Split ``endpoint``'s traffic between applications by weight (ConfigError if the
        weights are not valid); takes effect at every caller with the next table. It
        stops a rollout of ``endpoint``."""
        event = self.policy.set(endpoint, weights, self.apps)
        await self.desired.checkpoint()
        self.tables.splits()
        self._record(logging.INFO, event[0].upper() + event[1:])

    async def rollout(self, endpoint: str, canary: str, options: RolloutOptions) -> None:
        """Move ``endpoint``'s traffic to ``canary`` step by step (controller/rollout.py)."""
        now = asyncio.get_running_loop().time()
        started = new_rollout(endpoint, canary, options, self.apps, now)
        event = self.policy.start_rollout(started, self.apps)
        await self.desired.checkpoint()
        self.tables.splits()
        self._record(logging.INFO, event)

    async def shadow(self, endpoint: str, to: str | None, fraction: float, compare: str = "") -> None:
        """Copy ``fraction`` of ``endpoint``'s requests to ``to`` (routing/shadow.py)."""
        event = self.policy.set_shadow(endpoint, to, fraction, self.apps, compare)
        await self.desired.checkpoint()
        self.tables.splits()
        self._record(logging.INFO, event)

    def _move_rollouts(self) -> None:
        events = self.policy.tick(asyncio.get_running_loop().time(), self.apps)
        if events:
            self.tables.splits()
            self.actions.spawn(self.desired.checkpoint())
            for level, message in events:
                self._record(level, message)

    async def config_file(self) -> ConfigFile | None:
        return self.applied_file

    async def record_models(self, replica_id: str, models: tuple[str, ...], sequence: int) -> None:
        self.reports.note_models(replica_id, models, sequence)

    async def record_load(self, caller: str, loads: Loads, outcomes: Outcomes = ()) -> None:
        self.reports.record_load(caller, loads, outcomes)

    async def take_quota(
        self, front: str, asks: tuple[QuotaAsk, ...], charges: Charges = ()
    ) -> tuple[QuotaGrant, ...]:
        return self.quotas.take(front, asks, charges)

    async def app_exists(self, name: str) -> bool:
        return name in self.apps or any(d.app == name for d in self.deployments)

    async def listen(self, known: Versions, timeout_s: float) -> Updates:
        return await self.longpoll.listen(known, timeout_s)

    async def status(self) -> ServeStatus:
        return self.snapshot()

    def snapshot(self) -> ServeStatus:
        """Applications, deployments, replicas, traffic and events as they are now."""
        now = asyncio.get_running_loop().time()
        load = functools.partial(self.loads.total, now=now)
        spares = self._spares() if self._spares is not None else {}
        status = serve_status(
            self.apps,
            self.deployments,
            load,
            now,
            self.proxies,
            self.policy,
            self.events,
            spares,
            self.cluster.draining,
        )
        return dataclasses.replace(status, target_capacity=self.capacity.percent)

    def _record(self, level: int, message: str) -> None:
        """Log a lifecycle event and keep it for status()."""
        logger.log(level, message)
        self.events.append(EventInfo(time.time(), logging.getLevelName(level), message))

    # ------------------------------------------------------------------ reconcile

    async def _run(self) -> None:
        while True:
            started = time.perf_counter()
            try:
                self.cluster.follow()
                self._reconcile()
                self.cluster.release()
                if self.desired.unsaved():
                    self.actions.spawn(self.desired.checkpoint())
            except Exception:
                logger.exception("Reconcile step failed; retrying")
            controller_metrics.RECONCILE.observe(time.perf_counter() - started)
            if self.heap is not None:
                self.heap.tick(asyncio.get_running_loop().time())
            await self.tables.store(self.backend)
            await wait_event(self._wake, _LOOP_PERIOD_S)
            self._wake.clear()

    def _reconcile(self) -> None:
        """One pass: feed every autoscaler its load, and plan each deployment that had
        an event, a new target or a due time since its last plan (not every one: at
        thousands of replicas, most have nothing due on a given pass)."""
        now = asyncio.get_running_loop().time()
        self._move_rollouts()
        by_apps = self._scale_by_applications(now)
        for deployment_id, state in list(self.deployments.items()):
            if state.retire_after:
                if teardown.callers_remain(state, self.deployments):
                    continue  # deleted, it serves the replicas that may still call it
                state.retire_after = frozenset()
                self.longpoll.publish(replicas_key(deployment_id), DeploymentGone())
            load = self.loads.total(deployment_id, now)
            autoscaling = state.spec.config.autoscaling_config
            if deployment_id in by_apps:
                actions = by_apps[deployment_id]
            elif autoscaling is not None and not autoscaling.policy.is_default:
                actions = self.custom.scale_deployment(state, load, now)
            else:
                self.custom.forget(deployment_id)  # metrics kept only for a custom policy
                actions = autoscale(state, load, now)
            if actions or self._due.get(deployment_id, now) <= now:  # a decision moves the target
                draining = self.cluster.draining
                actions += plan(state, now, functools.partial(self._new_replica_id, state), draining)
                self._due[deployment_id] = next_due(state, draining)
            self.actions.perform(deployment_id, actions)
            if state.deleting and not state.replicas:
                del self.deployments[deployment_id]
                self._due.pop(deployment_id, None)
                self.custom.forget(deployment_id)

    def _scale_by_applications(self, now: float) -> dict[DeploymentID, list[Action]]:
        """Run the applications' autoscaling policies: the actions of each deployment
        they decide for (those deployments' own policies are not run)."""
        decided: dict[DeploymentID, list[Action]] = {}
        for app in self.apps.values():
            if app.autoscaling_policy is None:
                continue
            loads = {spec.id: self.loads.total(spec.id, now) for spec in app.deployments}
            for deployment, actions in self.custom.scale_app(app, self.deployments, loads, now):
                decided.setdefault(deployment, []).extend(actions)
        return decided

    def replan(self, deployment: DeploymentID | None = None) -> None:
        """Plan ``deployment`` (None: every one) on the next pass, and wake the loop."""
        if deployment is None:
            self._due.clear()
        else:
            self._due.pop(deployment, None)
        self._wake.set()

    def _place(self, deployment: DeploymentID, replica_id: str, node_id: str) -> ReplicaRank:
        state = self.deployments.get(deployment)
        if state is None:
            return ReplicaRank(-1, -1, -1)
        return place(state, replica_id, node_id)

    @staticmethod
    def _new_replica_id(state: DeploymentState) -> str:
        deployment = state.spec.id
        return f"{deployment.app}.{deployment.name}.{secrets.token_hex(3)}"

    def _on(self, deployment: DeploymentID, replica_id: str, event: Event) -> None:
        """Feed the outcome of a backend call to the deployment it belongs to now."""
        state = self.deployments.get(deployment)
        if state is None:
            return
        now = asyncio.get_running_loop().time()
        self.actions.perform(deployment, apply_event(state, replica_id, event, now))
        self._due.pop(deployment, None)
        self._wake.set()
