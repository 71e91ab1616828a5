"""Replicas on Ray, as the controller runs them: its backend that starts, stops,
checks, reconfigures and re-adopts replica actors (``replica_actor.py``) and keeps the
checkpoint and the published tables in the GCS."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import pickle
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup

from app_toolkit._runtime.backends.ray import stored
from app_toolkit._runtime.backends.ray.cluster import (
    NAMESPACE,
    REPLICA_PREFIX,
    SPARE_PREFIX,
    named_actors,
    remote,
)
from app_toolkit._runtime.backends.ray.nodes import NodeWatch
from app_toolkit._runtime.backends.ray.placement import (
    Placing,
    actor_placement,
    find_group,
    orphan_groups,
    remove_group,
    request_shape,
    unplaced,
)
from app_toolkit._runtime.backends.ray.proxies import ProxyFleet
from app_toolkit._runtime.backends.ray.replica_actor import ReplicaActor, ReplicaStart
from app_toolkit._runtime.backends.ray.spares import SparePool
from app_toolkit._runtime.controller.backend import ClusterView, Seat, Unplaced
from app_toolkit._runtime.messages import AdoptedReplica, DeploymentSpec, ReplicaInfo
from app_toolkit._runtime.request_context import ReplicaRank
from app_toolkit._runtime.tables import Table
from app_toolkit.config import DeploymentConfig
from app_toolkit.exceptions import DeployError, ReplicaUnavailableError

logger = logging.getLogger("app_toolkit.ray")

#: The controller's handle to one replica.
Actor = ActorHandle[Any]

_DESCRIBE_TIMEOUT_S = 10.0


class _ProcessDied(Exception):
    """A replica's process died before it finished starting."""


class RayReplicas:
    """The controller's Backend on Ray: replica actors, the GCS, the proxy fleet."""

    def __init__(self, proxies: ProxyFleet, nodes: NodeWatch, spares: SparePool | None = None) -> None:
        self._draining: set[asyncio.Future[None]] = set()
        self._proxies = proxies
        self._nodes = nodes
        #: Started processes that wait to be given a replica (none: every replica starts
        #: its own process).
        self.spares = spares
        #: Replicas whose actor is being started, by replica id (``cluster_view``).
        self._placing: dict[str, Placing] = {}
        #: The placement group of each replica that has one, by its actor handle's id.
        self._groups: dict[int, PlacementGroup] = {}

    async def start_replica(
        self, replica_id: str, spec: DeploymentSpec, seat: Seat
    ) -> tuple[ReplicaInfo, Actor]:
        http = self._proxies.http
        # (HTTPS: the proxies serve every request themselves, and keep the options.)
        direct = (
            spec.http_ingress
            and spec.config.direct_ingress
            and http.proxy_location != "Disabled"
            and http.client_tls is None
        )
        start = ReplicaStart(
            replica_id,
            spec.id,
            spec.config,
            spec.definition,
            spec.init_args,
            spec.code_version,
            seat.world_size,
            http if direct else None,
            http if spec.is_asgi and http.keys_required else None,
        )
        config = spec.config
        spare = self.spares.take(config) if self.spares is not None else None
        if spare is not None:
            actor, node = spare
            try:
                return await self._initialize(actor, start, seat.place(node))
            except _ProcessDied as exc:  # a spare that died waiting: a fresh process then
                logger.info("A spare process could not become %s (%s); starting a new one", replica_id, exc)
            except asyncio.CancelledError:  # no longer wanted while its constructor ran
                ray.kill(actor, no_restart=True)
                raise
        with self.spares.busy() if self.spares is not None else contextlib.nullcontext():
            return await self._start_fresh(replica_id, config, start, seat)

    async def _start_fresh(
        self, replica_id: str, config: DeploymentConfig, start: ReplicaStart, seat: Seat
    ) -> tuple[ReplicaInfo, Actor]:
        """Start a replica in a process of its own (and its placement group, if it has
        one); whatever fails or is abandoned on the way leaves neither behind."""
        placed, group = actor_placement(replica_id, start.deployment, config)
        actor = None
        try:
            named: dict[str, Any] = {"name": REPLICA_PREFIX + replica_id, "namespace": NAMESPACE}
            if config.ray_actor_options.runtime_env is not None:
                named["runtime_env"] = config.ray_actor_options.runtime_env
            actor = remote(ReplicaActor, lifetime="detached", **named, **placed).remote(start)
            bundles = list(config.placement_group_bundles or [])
            strategy = config.placement_group_strategy or "PACK"
            self._placing[replica_id] = Placing(
                actor,
                config.reserved_resources(),
                request_shape(placed),
                config.max_replicas_per_node,
                group,
                bundles,
                strategy,
            )
            node = await actor.node_id.remote()  # Ray placed it (and its group)
            started = await self._initialize(actor, None, seat.place(node))
        except _ProcessDied as exc:
            remove_group(group)
            raise DeployError(f"Replica process died while starting: {exc}") from None
        except BaseException:  # its constructor failed, or the start was abandoned
            if actor is not None:
                ray.kill(actor, no_restart=True)  # a pending actor is never placed then
            remove_group(group)
            raise
        finally:
            self._placing.pop(replica_id, None)
        if group is not None:
            self._groups[id(actor)] = group
        return started

    async def _initialize(
        self, actor: Actor, start: ReplicaStart | None, rank: ReplicaRank
    ) -> tuple[ReplicaInfo, Actor]:
        try:
            return await actor.initialize.remote(start, rank), actor
        except RayTaskError as exc:
            ray.kill(actor, no_restart=True)
            cause = exc.cause if exc.cause is not None else exc
            raise DeployError(str(cause)) from None
        except RayActorError as exc:
            ray.kill(actor, no_restart=True)
            raise _ProcessDied(str(exc)) from None

    async def stop_replica(
        self, handle: Actor, graceful: bool, hurry: bool = False, grace_s: float | None = None
    ) -> None:
        with self.spares.busy() if self.spares is not None else contextlib.nullcontext():
            if graceful:
                try:
                    await handle.drain.remote(hurry, grace_s)
                except Exception as exc:  # noqa: BLE001 - a dead replica needs no draining
                    logger.info("Draining a replica failed: %s", exc)
            ray.kill(handle, no_restart=True)
            remove_group(self._groups.pop(id(handle), None))

    async def cluster_view(self) -> ClusterView:
        nodes = await self._nodes.refresh()
        placing = dict(self._placing)
        found: dict[str, Unplaced] = {}
        if placing:
            names = {f"{REPLICA_PREFIX}{replica_id}": replica_id for replica_id in placing}
            found = await asyncio.to_thread(unplaced, placing, names, set(nodes.draining))
        return ClusterView(nodes.seconds_left(), found, frozenset(placing))

    async def release_node(self, node_id: str) -> None:
        if self.spares is not None:
            self.spares.release(node_id)
        await self._proxies.release(node_id)

    async def reconfigure_replica(self, handle: Actor, config: DeploymentConfig) -> None:
        try:
            await handle.reconfigure.remote(config)
        except RayTaskError as exc:
            cause = exc.cause if exc.cause is not None else exc
            raise DeployError(str(cause)) from None

    async def check_health(self, handle: Actor, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(handle.check_health.remote(), timeout_s)
        except RayActorError as exc:
            # Ray's message runs to a dozen lines of advice; its first says what happened.
            first_line = next(iter(str(exc).strip().splitlines()), type(exc).__name__)
            raise ReplicaUnavailableError(first_line) from None
        except RayTaskError as exc:
            raise RuntimeError(str(exc.cause or exc)) from None

    async def find_replicas(self) -> list[AdoptedReplica]:
        """Replicas left running by a previous controller; those that cannot say what
        they are (still starting, draining, unresponsive) are stopped, and so are the
        placement groups no replica holds any longer."""
        names = [name for name in named_actors() if name.startswith((REPLICA_PREFIX, SPARE_PREFIX))]
        actors = [ray.get_actor(name, namespace=NAMESPACE) for name in names]
        answers = await asyncio.gather(*(self._describe(actor) for actor in actors))
        found: list[AdoptedReplica] = []
        for name, actor, described in zip(names, actors, answers, strict=True):
            replica_id = described.info.replica_id if isinstance(described, AdoptedReplica) else name
            group = find_group(replica_id.removeprefix(REPLICA_PREFIX))
            if group is not None:
                self._groups[id(actor)] = group  # released when the replica stops
            if isinstance(described, AdoptedReplica):
                found.append(dataclasses.replace(described, handle=actor))
            elif described == "spare":  # the new pool starts its own
                ray.kill(actor, no_restart=True)
            elif described == "draining":  # let its in-flight requests finish first
                logger.warning("Letting replica %s left by a previous controller drain", name)
                self._draining.add(asyncio.ensure_future(self.stop_replica(actor, graceful=True)))
                self._draining = {task for task in self._draining if not task.done()}
            else:
                logger.warning("Stopping replica %s left by a previous controller: %s", name, described)
                await self.stop_replica(actor, graceful=False)
        kept = {
            name.removeprefix(REPLICA_PREFIX) for name in named_actors() if name.startswith(REPLICA_PREFIX)
        }
        for group in orphan_groups(kept):  # a controller that died while starting a replica
            remove_group(group)
        return found

    @staticmethod
    async def _describe(actor: Actor) -> AdoptedReplica | str:
        try:
            described: AdoptedReplica | str = await asyncio.wait_for(
                actor.describe.remote(), _DESCRIBE_TIMEOUT_S
            )
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, it cannot be adopted
            return f"unresponsive ({exc})"
        return described

    def load_object(self, data: bytes) -> object:
        return pickle.loads(data)  # what the codec wrote (ray.cloudpickle is importable here)

    async def save_checkpoint(self, data: bytes) -> None:
        stored.put(stored.CHECKPOINT_KEY, data)

    async def load_checkpoint(self) -> bytes | None:
        return stored.get(stored.CHECKPOINT_KEY)

    async def save_tables(self, tables: dict[str, Table]) -> None:
        stored.save_tables(tables)

    async def proxies_lagging(self, key: str, version: int, timeout_s: float) -> list[str]:
        return await self._proxies.lagging(key, version, timeout_s)

    async def stop_proxies(self) -> None:
        # Whatever did not stop within the shutdown's wait goes now, with what it reserved.
        for name in named_actors():
            if name.startswith(REPLICA_PREFIX):
                ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
        for group in orphan_groups(set()):
            remove_group(group)
        if self.spares is not None:
            await self.spares.stop()
        await self._proxies.stop()
        stored.forget_serving_state()
