"""What a proxy on Ray shows at ``/-/metrics`` and ``/-/dashboard``: its own process's
metrics, and those of the toolkit processes on its node — the replicas the stored tables
place there, and the controller when it runs there — and the controller's status. Read
when asked, each process with a timeout; a process that does not answer is left out of
that scrape (and counted)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray

from app_toolkit import metrics
from app_toolkit._runtime.backends.ray import stored
from app_toolkit._runtime.backends.ray.cluster import CONTROLLER_NAME, NAMESPACE, PROXY_PREFIX, REPLICA_PREFIX
from app_toolkit._runtime.controller.api import ControllerAPI
from app_toolkit._runtime.tables import ReplicaTable
from app_toolkit.metrics import FamilySnapshot
from app_toolkit.status import ServeStatus

logger = logging.getLogger("app_toolkit.proxy")

_READ_TIMEOUT_S = 5.0

MISSED = metrics.Counter(
    "app_toolkit_metrics_unread_processes_total",
    "Processes of this node whose metrics a scrape could not read in time",
)


class NodeMetrics:
    """Gathers the metrics of this node's toolkit processes."""

    def __init__(self) -> None:
        self._node = ray.get_runtime_context().get_node_id()
        self._actors: dict[str, Any] = {}  # actor name -> handle, for the replicas here
        self._controller: Any = None

    async def gather(self) -> list[list[FamilySnapshot]]:
        reads = [self._read_controller(), *(self._read(name) for name in await self._replica_names())]
        found = await asyncio.gather(*reads)
        return [metrics.snapshot(), *(families for families in found if families is not None)]

    async def _replica_names(self) -> list[str]:
        tables = await asyncio.to_thread(stored.load_tables)
        names = [
            info.actor or REPLICA_PREFIX + info.replica_id
            for table in (tables[1].values() if tables else ())
            if isinstance(table, ReplicaTable)
            for info in table.replicas
            if info.node_id == self._node
        ]
        for gone in set(self._actors) - set(names):
            del self._actors[gone]
        return names

    async def _read(self, name: str) -> list[FamilySnapshot] | None:
        try:
            actor = self._actors.get(name)
            if actor is None:
                actor = self._actors[name] = await asyncio.to_thread(ray.get_actor, name, namespace=NAMESPACE)
            families: list[FamilySnapshot] = await asyncio.wait_for(actor.metrics.remote(), _READ_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - a replica that just left, or is hung
            logger.debug("No metrics from %s: %r", name, exc)
            self._actors.pop(name, None)
            MISSED.inc()
            return None
        return families

    async def from_proxy(self) -> list[list[FamilySnapshot]]:
        """What the node's proxy gathers (an ingress replica's front answers /-/metrics
        on the connections it was handed as the proxy would); this process's alone when
        the proxy does not answer in time."""
        name = PROXY_PREFIX + self._node
        try:
            actor = self._actors.get(name)
            if actor is None:
                actor = self._actors[name] = await asyncio.to_thread(ray.get_actor, name, namespace=NAMESPACE)
            gathered: list[list[FamilySnapshot]] = await asyncio.wait_for(
                actor.gather.remote(), _READ_TIMEOUT_S * 2
            )
        except Exception as exc:  # noqa: BLE001 - the proxy is restarting
            logger.debug("No metrics from the node's proxy: %r", exc)
            self._actors.pop(name, None)
            MISSED.inc()
            return [metrics.snapshot()]
        return gathered

    async def status(self) -> ServeStatus:
        """The controller's status (raises when it does not answer in time)."""
        try:
            controller = await self._find_controller()
            answer: ServeStatus = await asyncio.wait_for(controller.run.remote(_status), _READ_TIMEOUT_S)
        except Exception:
            self._controller = None  # look it up again next time (it may have restarted)
            raise
        return answer

    async def _find_controller(self) -> Any:
        if self._controller is None:
            self._controller = await asyncio.to_thread(ray.get_actor, CONTROLLER_NAME, namespace=NAMESPACE)
        return self._controller

    async def _read_controller(self) -> list[FamilySnapshot] | None:
        try:
            controller = await self._find_controller()
            answer: tuple[str, list[FamilySnapshot]] = await asyncio.wait_for(
                controller.metrics.remote(), _READ_TIMEOUT_S
            )
            node, families = answer
        except Exception as exc:  # noqa: BLE001 - the controller is restarting or down
            logger.debug("No metrics from the controller: %r", exc)
            self._controller = None
            MISSED.inc()
            return None
        return families if node == self._node else None


async def _status(controller: ControllerAPI) -> ServeStatus:
    """The control call status() makes (a module-level function: pickled by name)."""
    return await controller.status()
