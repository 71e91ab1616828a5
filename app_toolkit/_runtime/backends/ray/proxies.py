"""The controller's proxies on Ray: one per alive node (``EveryNode``, the default), one
on the controller's node (``HeadOnly``) or none (``Disabled``).

The fleet starts a proxy on every node that joins, starts a proxy's server again after Ray
restarted its process, and retires the proxy of a node that left. Proxies on one machine
share the port (``front/server.py``, ``listen_socket``). After a controller restart the proxies of
its previous life are found by name and kept: they never stopped serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray
from ray.exceptions import RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from app_toolkit._runtime.backends.ray.cluster import NAMESPACE, PROXY_PREFIX, named_actors, remote
from app_toolkit._runtime.backends.ray.nodes import NodeWatch
from app_toolkit._runtime.controller.proxy_states import ProxyStates
from app_toolkit.config import HTTPOptions
from app_toolkit.exceptions import ConfigError

logger = logging.getLogger("app_toolkit.ray")

_CHECK_PERIOD_S = 1.0
_READY_TIMEOUT_S = 30.0
#: A new proxy's first answer includes its process's start (Python, Ray's worker, the
#: front's imports): on a loaded 2-core node that took over 30 s. Ray itself gives a
#: worker process 60 s to register (worker_register_timeout_seconds).
_START_TIMEOUT_S = 60.0
#: How long a proxy joining the others' port waits for its routes before it listens
#: anyway (they come within a second of its first poll): well inside either bound above.
#: Only proxies the supervisor readies wait (and one Ray restarted, by itself): the one
#: ``start`` readies (this node's) is readied while the controller has not started, and
#: its poll waits for that.
ROUTES_WAIT_S = 10.0
#: A leaving node's proxy finishes its connections within 10 s (ProxyActor.stop).
_RELEASE_TIMEOUT_S = 15.0
#: A leaving node's proxy answers /-/healthz 503 for at least this long before it stops
#: (load balancers that check every few seconds stop sending meanwhile).
_LOAD_BALANCER_S = 5.0


class ProxyFleet:
    """Keeps the wanted proxies serving; ``states`` is what ``status()`` shows of them."""

    def __init__(self, actor_class: type, http: HTTPOptions, nodes: NodeWatch) -> None:
        self._actor_class = actor_class
        self._http = http
        self._nodes = nodes
        #: Leaving nodes whose proxy was told so, and when it first was.
        self._leaving: dict[str, float] = {}
        #: Each proxy's status and URL.
        self.states = ProxyStates()
        self._actors: dict[str, Any] = {}
        self._port = http.port
        self._home = ray.get_runtime_context().get_node_id()
        self._supervisor: asyncio.Task[None] | None = None

    @property
    def http(self) -> HTTPOptions:
        """The proxies' options (ingress replicas that serve connections use them too)."""
        return self._http

    async def start(self) -> int:
        """Start (or, after a controller restart, find) the proxy on this node; returns the
        port all share. A proxy on this node that cannot listen is a ``ConfigError``. The
        supervisor starts (or finds) the other nodes' proxies from then on, at once:
        they wait for their routes, which the controller sends once it has started.
        ``Disabled``: no proxies (handles only)."""
        if self._http.proxy_location == "Disabled":
            return self._port
        for name in named_actors():
            if name.startswith(PROXY_PREFIX):
                self._actors[name[len(PROXY_PREFIX) :]] = ray.get_actor(name, namespace=NAMESPACE)
        try:
            # A fresh toolkit checks that nobody else listens on the port yet.
            await self._ready(self._home, exclusive=not self._actors, routes_wait_s=0.0)
        except RayTaskError as exc:
            self._retire(self._home)
            raise ConfigError(str(exc.cause or exc)) from None
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise())
        return self._port

    async def stop(self) -> None:
        """Stop every proxy (each finishes its open connections, bounded)."""
        if self._supervisor is not None:
            self._supervisor.cancel()
        actors = list(self._actors.values())
        await asyncio.gather(*(actor.stop.remote() for actor in actors), return_exceptions=True)
        for node in list(self._actors):
            self._retire(node)

    async def _supervise(self) -> None:
        while True:
            try:
                await self._follow_nodes()
            except Exception:
                logger.exception("Checking the proxies failed; trying again")
            await asyncio.sleep(_CHECK_PERIOD_S)

    async def _follow_nodes(self) -> None:
        """Retire proxies of nodes that left, start proxies on nodes that joined, and make
        sure each one serves (``ready()`` is idempotent; a restarted proxy starts again).
        The proxy of a node that is leaving is told so (its /-/healthz answers 503) and
        keeps serving until ``release``; none starts there."""
        nodes = await self._nodes.refresh()
        alive = nodes.alive
        wanted = alive if self._http.proxy_location == "EveryNode" else {self._home}
        for node in [node for node in self._actors if node not in wanted]:
            logger.info("Retiring the proxy of node %s (gone or not wanted)", node)
            self._retire(node)
        self._leaving = {node: at for node, at in self._leaving.items() if node in nodes.draining}
        for node in [node for node in nodes.draining if node in self._actors]:
            if node not in self._leaving:
                logger.info("The node of proxy %s is leaving: its /-/healthz answers 503", node)
                self._leaving[node] = time.monotonic()
            try:  # told on every pass: a proxy Ray restarted meanwhile knows it too
                await asyncio.wait_for(self._actors[node].leave.remote(), _READY_TIMEOUT_S)
                self.states.leaving(node)  # DRAINING: it serves on, its /-/healthz says 503
            except Exception as exc:  # noqa: BLE001 - told again on the next pass
                logger.warning("Could not tell the proxy of node %s that its node leaves: %s", node, exc)
        wanted = {node for node in wanted if node not in nodes.draining or node in self._actors}
        results = await asyncio.gather(
            *(self._ready(node, exclusive=False, routes_wait_s=ROUTES_WAIT_S) for node in wanted),
            return_exceptions=True,
        )
        for node, result in zip(wanted, results, strict=True):
            if isinstance(result, BaseException) and node in self._actors:
                logger.warning("The proxy on node %s is not serving yet: %s", node, result)

    async def _ready(self, node: str, *, exclusive: bool, routes_wait_s: float) -> None:
        actor = self._actors.get(node)
        if actor is None and node in self._nodes.draining:
            return  # leaving (its proxy released meanwhile, or none yet): none starts there
        timeout_s = _READY_TIMEOUT_S
        if actor is None:
            timeout_s = _START_TIMEOUT_S  # its process starts first
            actor = self._actors[node] = remote(
                self._actor_class,
                name=f"{PROXY_PREFIX}{node}",
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                max_restarts=-1,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote(self._http)
            self.states.starting(node)
        try:
            answer = actor.ready.remote(self._port, exclusive, routes_wait_s)
            url, port = await asyncio.wait_for(answer, timeout_s)
        except Exception:
            if self._actors.get(node) is actor:  # not released (a leaving node) meanwhile
                self.states.not_serving(node)  # status() shows it UNHEALTHY
            raise
        self._port = port  # with port 0, the first proxy's pick is everyone's port
        if self._actors.get(node) is actor:
            self.states.serving(node, url)

    async def lagging(self, key: str, version: int, timeout_s: float) -> list[str]:
        """The nodes whose proxy serves but does not route by ``key``'s table at
        ``version`` or later after up to ``timeout_s`` (a proxy that does not answer counts
        among them). A proxy still starting is not asked: it loads the latest tables
        before it serves."""
        serving = self.states.urls()
        nodes = [node for node in self._actors if node in serving]
        answers = await asyncio.gather(
            *(
                asyncio.wait_for(self._actors[node].holds.remote(key, version, timeout_s), timeout_s + 1.0)
                for node in nodes
            ),
            return_exceptions=True,
        )
        return [node for node, answer in zip(nodes, answers, strict=True) if answer is not True]

    async def release(self, node: str) -> None:
        """A leaving node runs none of our replicas anymore: its proxy stops accepting,
        finishes its connections (bounded) and stops, so the node can go."""
        actor = self._actors.get(node)
        if actor is None or node == self._home:
            return  # the controller's own node leaving is not handled here
        # Load balancers get a moment to see its /-/healthz say 503 before it stops.
        told = self._leaving.get(node, time.monotonic())
        await asyncio.sleep(max(told + _LOAD_BALANCER_S - time.monotonic(), 0.0))
        try:
            await asyncio.wait_for(actor.stop.remote(), _RELEASE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - stopped it must be, whatever it said
            logger.warning("The proxy of leaving node %s did not stop cleanly: %s", node, exc)
        logger.info("Stopped the proxy of leaving node %s", node)
        self._retire(node)

    def _retire(self, node: str) -> None:
        actor = self._actors.pop(node, None)
        self.states.removed(node)
        if actor is not None:
            ray.kill(actor, no_restart=True)
