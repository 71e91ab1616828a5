"""The replica actor: the process that hosts one ``ReplicaCore`` on Ray, its channel
server and (direct ingress) its own HTTP front. Started with a ``ReplicaStart``, or
without one as a spare (``spares.py``) that gets it in ``initialize``."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import itertools
import logging
import os
import pickle
import secrets
import time

import ray

from app_toolkit import metrics
from app_toolkit._runtime.backends.ray import link
from app_toolkit._runtime.backends.ray.cluster import (
    configure_worker,
    controller_actor,
    data_plane_host,
    settle_heap,
)
from app_toolkit._runtime.backends.ray.codec import dumps
from app_toolkit._runtime.backends.ray.node_metrics import NodeMetrics
from app_toolkit._runtime.channel.server import start_server
from app_toolkit._runtime.channel.tls import replica_tls
from app_toolkit._runtime.direct_ingress.replica_server import ReplicaFront
from app_toolkit._runtime.front import key_door
from app_toolkit._runtime.front.key_check import KeyRing
from app_toolkit._runtime.front.key_door import KeyDoor
from app_toolkit._runtime.front.key_limits import KeyLimits
from app_toolkit._runtime.messages import AdoptedReplica, DeploymentID, ReplicaInfo
from app_toolkit._runtime.replica.replica import ReplicaCore
from app_toolkit._runtime.request_context import ReplicaRank
from app_toolkit._runtime.routing import caller_metrics
from app_toolkit.config import DeploymentConfig, HTTPOptions
from app_toolkit.metrics import FamilySnapshot

logger = logging.getLogger("app_toolkit.ray")


def _import_web_framework() -> None:
    """Import what an HTTP deployment's code needs (FastAPI, the toolkit's route table),
    which the toolkit itself loads only where an app is built."""
    for module in ("fastapi", "app_toolkit.route_table", "app_toolkit._runtime.replica.docs_pages"):
        importlib.import_module(module)


def _load_quietly(code: dict[str, bytes]) -> list[str]:
    loaded = []
    for key, definition in code.items():
        try:
            pickle.loads(definition)
        except Exception as exc:  # noqa: BLE001 - user code: its replica's start says why
            logger.debug("A spare could not load the code of %s ahead: %s", key, exc)
            continue
        loaded.append(key)
    return loaded


class _Phases:
    """Times the steps of a start into ``into`` (step name -> seconds)."""

    def __init__(self, into: dict[str, float]) -> None:
        self._into = into
        self._at = time.perf_counter()

    def lap(self, step: str) -> None:
        now = time.perf_counter()
        self._into[step] = now - self._at
        self._at = now


@dataclasses.dataclass(frozen=True)
class ReplicaStart:
    """What a replica actor needs to become one replica of a deployment."""

    replica_id: str
    deployment: DeploymentID
    config: DeploymentConfig
    definition: bytes
    init_args: bytes
    code_version: str
    world_size: int = 0
    #: The proxy's options when this replica serves client connections itself.
    front: HTTPOptions | None = None
    #: The proxy's options when this replica runs an app with API keys on: an open route
    #: may let a request in as a key (``admit_key``), under the key's limits (through
    #: its front's door, if it has a front).
    keys: HTTPOptions | None = None


class ReplicaActor:
    """Hosts one ``ReplicaCore`` and its channel server. Started with a ``ReplicaStart``,
    or without one as a spare (``spares.py``) that gets it in ``initialize``."""

    def __init__(self, start: ReplicaStart | None = None) -> None:
        configure_worker()
        self._start = start
        self._core: ReplicaCore | None = None
        self._server: asyncio.Server | None = None
        self._info: ReplicaInfo | None = None
        self._front: ReplicaFront | None = None
        #: Seconds each step of ``initialize`` took (``start_phases``).
        self._phases: dict[str, float] = {}
        self._preloaded: list[str] = []  # the code a spare loaded ahead (``preload``)
        self._rank = ReplicaRank(-1, -1, -1)
        if start is None:  # a spare: what deployments import, ready and out of the collector's way
            _import_web_framework()
            settle_heap()

    async def preload(self, code: dict[str, bytes]) -> list[str]:
        """A spare: load these deployments' code now (``code``: "app/deployment@version"
        -> serialized definition; their modules are imported, the objects dropped), so
        that a replica started here later finds it loaded. One that fails is skipped: its
        replica's own start reports why. Returns the keys loaded."""
        if self._start is not None:
            return []  # given a replica meanwhile: its own code is what counts
        loaded = await asyncio.to_thread(_load_quietly, code)
        settle_heap()
        self._preloaded += loaded
        return loaded

    def loaded_ahead(self) -> list[str]:
        """The code this process loaded as a spare ("app/deployment@version" keys)."""
        return list(self._preloaded)

    def start_phases(self) -> dict[str, float]:
        """Seconds each step of becoming a replica took: loading the deployment's code,
        its constructor (and lifespan start), the channel server, the client-connection
        front, the heap settling (for benchmarks and tools)."""
        return dict(self._phases)

    def replica_id(self) -> str | None:
        """The replica this process is (None: a spare not given one yet)."""
        return self._start.replica_id if self._start is not None else None

    def node_id(self) -> str:
        """The node this process runs on (answered once Ray placed and started it)."""
        return ray.get_runtime_context().get_node_id()

    async def initialize(self, start: ReplicaStart | None, rank: ReplicaRank) -> ReplicaInfo:
        """Become the replica ``start`` describes (a spare: given now), at ``rank``."""
        self._rank = rank
        if start is not None:
            if self._start is not None and self._start != start:
                raise RuntimeError(f"This process is replica {self._start.replica_id} already")
            self._start = start
        if self._start is None:
            raise RuntimeError("A spare replica process was initialized without a replica to be")
        replica_id, deployment, config = self._start.replica_id, self._start.deployment, self._start.config
        tls = replica_tls()  # a TLS misconfiguration fails the start before user code runs
        metrics.set_process_labels(replica=replica_id)  # the user's own metrics, too
        caller_metrics.set_caller(replica_id)
        # Handle calls of the user's code run on this actor's loop (before the user's
        # constructor, which may make some).
        plane = link.attach(asyncio.get_running_loop()).data_plane
        clock = _Phases(self._phases)
        definition, init_args = pickle.loads(self._start.definition), pickle.loads(self._start.init_args)
        clock.lap("code")
        core = ReplicaCore(
            replica_id,
            deployment,
            config,
            definition,
            init_args,
            dumps,
            rank,
            self._start.world_size,
            owns_process=True,
            code_version=self._start.code_version,
        )
        controller = controller_actor()
        reports = itertools.count()

        def report_models(models: tuple[str, ...]) -> None:
            sequence = next(reports)  # Ray owns the call: nothing here waits for it
            controller.run.remote(lambda c: c.record_models(replica_id, models, sequence))

        core.report_models = report_models
        await core.start()
        if core.samples_stats:  # custom metrics and routing stats go with this process's load reports
            plane.subscriber.add_stats(replica_id, core.take_stats)
        clock.lap("constructor")
        token = secrets.token_bytes(16)
        host = data_plane_host()
        self._server, port = await start_server(core, host, token, dumps, tls)
        self._core = core
        clock.lap("channel")
        handoff = ""
        if self._start.front is not None:
            node = NodeMetrics()
            front = ReplicaFront(core, self._start.front, plane.subscriber, node.from_proxy, node.status)
            try:
                handoff = await front.start()
                self._front = front
                # Requests on the connections it owns reach no caller's dispatcher: this
                # process reports them, so the autoscaler sees the direct traffic too.
                plane.subscriber.add_load(deployment, lambda: float(core.direct_ongoing))
            except OSError as exc:  # serving matters more than the faster path: the proxy forwards
                logger.warning("%s takes no client connections (its hand-off socket: %s)", replica_id, exc)
                await front.stop(timeout_s=1.0)
        if self._start.keys is not None and key_door.installed() is None:
            key_door.install(KeyDoor(KeyRing(self._start.keys), KeyLimits(plane.subscriber.take_quota)))
        clock.lap("front")
        settle_heap()
        clock.lap("heap")
        self._info = ReplicaInfo(
            replica_id,
            deployment,
            host,
            port,
            token,
            config.max_ongoing_requests,
            ray.get_runtime_context().get_node_id(),
            tls=tls is not None,
            rank=rank.rank,
            handoff=handoff,
            actor=ray.get_runtime_context().get_actor_name() or "",
        )
        return self._info

    async def describe(self) -> AdoptedReplica | str:
        """What a restarted controller needs to adopt this replica, or why it cannot:
        "starting" or "draining"."""
        core = self._core
        if self._start is None:
            return "spare"
        if core is None or self._info is None:
            return "starting"
        if core.draining:
            return "draining"
        # Its newest routing stats too: a restarted controller's tables have them at once.
        stats = core.routing_stats.latest if core.routing_stats is not None else ""
        info = dataclasses.replace(
            self._info, max_ongoing_requests=core.config.max_ongoing_requests, routing_stats=stats
        )
        rank = self._rank
        return AdoptedReplica(
            info, self._start.code_version, core.config, None, rank.node_rank, rank.local_rank
        )

    async def check_health(self) -> None:
        assert self._core is not None
        await self._core.check_health()

    async def reconfigure(self, config: DeploymentConfig) -> None:
        assert self._core is not None
        await self._core.update_config(config)

    async def metrics(self) -> list[FamilySnapshot]:
        """This replica process's metrics (the node's proxy reads them for /-/metrics)."""
        return metrics.snapshot()

    async def stats(self) -> dict[str, int]:
        """Requests running, asyncio tasks alive, the process id and (a spare) how many
        deployments' code it loaded ahead (for tests and tools)."""
        return {
            "ongoing": self._core.ongoing if self._core else 0,
            "tasks": len(asyncio.all_tasks()),
            "pid": os.getpid(),
            "preloaded": len(self._preloaded),
        }

    async def drain(self, hurry: bool = False, grace_s: float | None = None) -> None:
        """Stop serving gracefully (``ReplicaCore.drain``; ``hurry``: open streams and
        WebSockets end at once; ``grace_s``: a grace period shorter than its own), then
        close the channel server."""
        core, front = self._core, self._front
        if core is not None:
            timeout_s = core.grace_s(grace_s)
            # Its client connections go back to the proxy as they become idle, while the
            # requests running here finish.
            drained = [core.drain(hurry, grace_s)]
            if front is not None:
                drained.append(front.drain(timeout_s))
            await asyncio.gather(*drained)
            # Callers that still have the old table may send here for a moment: refuse
            # those requests (they are retried elsewhere) rather than die under them.
            await core.linger()
            if front is not None:
                await front.stop(timeout_s)
        door = key_door.installed()
        if door is not None:  # its requests have ended: its keeper and asks end too
            door.limits.close()
        if self._server is not None:
            self._server.close()
