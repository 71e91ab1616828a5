"""The tables callers follow, built from the controller's records and published on its
long poll: each deployment's replica table (with its traffic split and shadow) and the
application table (every application's prefix and routes)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Protocol

from app_toolkit._runtime.controller.backend import Backend
from app_toolkit._runtime.controller.deployment_state import DeploymentState, replica_table
from app_toolkit._runtime.controller.longpoll import LongPollHost
from app_toolkit._runtime.controller.traffic import TrafficPolicy
from app_toolkit._runtime.messages import AppSpec, DeploymentID, RouteInfo
from app_toolkit._runtime.tables import APPLICATIONS_KEY, ApplicationTable, ShadowTarget, replicas_key
from app_toolkit.config import logs_access

logger = logging.getLogger("app_toolkit.controller")

#: The published tables are stored (for proxies that restart while the controller is
#: down) at most this often, and only when they changed.
TABLES_STORE_PERIOD_S = 0.5

#: A table's traffic policy: its split and its shadow (tables.ReplicaTable).
Policy = tuple[tuple[tuple[DeploymentID, float], ...], ShadowTarget | None]
_NO_POLICY: Policy = ((), None)


class Records(Protocol):
    """What the controller keeps that the tables are built from."""

    apps: dict[str, AppSpec]
    deployments: dict[DeploymentID, DeploymentState]
    policy: TrafficPolicy
    longpoll: LongPollHost


class TablePublisher:
    """Publishes the tables of one controller's records."""

    def __init__(self, records: Records) -> None:
        self._records = records
        self._split_deployments: set[DeploymentID] = set()  # non-ingress ones published with a split
        # The split and shadow each deployment's table was last published with.
        self._published: dict[DeploymentID, Policy] = {}
        # The long poll's generation last stored, and when.
        self._stored: tuple[int, float] = (-1, float("-inf"))

    async def store(self, backend: Backend[Any]) -> None:
        """Store the published tables if they changed (at most every
        ``TABLES_STORE_PERIOD_S``): a proxy restarted while the controller is down
        serves from them."""
        longpoll = self._records.longpoll
        generation, stored_at = self._stored
        now = asyncio.get_running_loop().time()
        if longpoll.generation == generation or now - stored_at < TABLES_STORE_PERIOD_S:
            return
        current = longpoll.generation
        try:
            await backend.save_tables(longpoll.snapshot())
        except Exception:
            logger.exception("Storing the published tables failed; trying again")
        else:
            generation = current
        self._stored = (generation, now)

    def _policy_of(self, deployment: DeploymentID) -> Policy:
        """The split and shadow ``deployment``'s table carries."""
        apps, policy = self._records.apps, self._records.policy
        app = apps.get(deployment.app)
        split = policy.split(deployment, apps)
        is_ingress = app is not None and app.ingress == deployment.name
        return split, policy.shadow(app, apps) if app is not None and is_ingress else None

    def replicas(self, deployment: DeploymentID) -> None:
        """Publish ``deployment``'s replica table (not once it is being deleted, unless it
        still serves its callers: teardown.py)."""
        state = self._records.deployments.get(deployment)
        if state is not None and (not state.deleting or state.retire_after):
            table = replica_table(state)
            split, shadow = self._published[deployment] = self._policy_of(deployment)
            if split or shadow:
                table = dataclasses.replace(table, split=split, shadow=shadow)
            self._records.longpoll.publish(replicas_key(deployment), table)

    def splits(self) -> None:
        """Republish the tables whose split or shadow changed, among every ingress and
        every deployment that has (or just had) a split of its own. (Building a table
        costs its replicas; a deploy among a thousand apps rebuilds only its own.)"""
        apps = self._records.apps
        endpoints = set(self._records.policy.endpoints(apps))
        for deployment in endpoints | self._split_deployments:
            if self._published.get(deployment, _NO_POLICY) != self._policy_of(deployment):
                self.replicas(deployment)
        live = self._records.deployments.keys()
        self._published = {d: p for d, p in self._published.items() if d in live}
        self._split_deployments = {d for d in endpoints if d.name != apps[d.app].ingress} if apps else set()

    def routes(self) -> None:
        """Publish the application table."""
        routes = sorted(
            (
                RouteInfo(
                    app.route_prefix,
                    app.name,
                    DeploymentID(app.name, app.ingress),
                    app.routes,
                    logs_access(app.deployment(app.ingress).config.logging_config),
                    app.cors,
                )
                for app in self._records.apps.values()
                if app.route_prefix is not None
            ),
            key=lambda route: route.route_prefix,
        )
        self._records.longpoll.publish(APPLICATIONS_KEY, ApplicationTable(tuple(routes)))
