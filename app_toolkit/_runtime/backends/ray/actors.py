"""The Ray backend's system actors: the controller and the proxy (one per node).

Ray is the control plane and the engine: the controller, proxies and replicas are Ray
actors (placement, resources, restarts), desired state lives in Ray's GCS key-value store,
control calls are actor calls. Requests travel over the channel (``_runtime/channel``).
Only the modules of this package import ``ray``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import warnings
from typing import TypeVar

import ray

from app_toolkit import metrics
from app_toolkit._runtime.backends.ray import link, stored
from app_toolkit._runtime.backends.ray.cluster import configure_worker, node_address, settle_heap
from app_toolkit._runtime.backends.ray.node_metrics import NodeMetrics
from app_toolkit._runtime.backends.ray.nodes import NodeWatch
from app_toolkit._runtime.backends.ray.proxies import ROUTES_WAIT_S, ProxyFleet
from app_toolkit._runtime.backends.ray.replica_actor import ReplicaActor
from app_toolkit._runtime.backends.ray.replicas import RayReplicas
from app_toolkit._runtime.backends.ray.spares import SparePool, code_to_preload, spare_setting
from app_toolkit._runtime.controller.api import ControlCall
from app_toolkit._runtime.controller.controller import ControllerCore
from app_toolkit._runtime.controller.heap import HeapKeeper
from app_toolkit._runtime.front.http_front import HTTPFront
from app_toolkit._runtime.front.server import Adopter, ProxyServer, listen_socket, serve
from app_toolkit._runtime.proxy.acceptor import DirectListener
from app_toolkit._runtime.proxy.handoff_targets import HandoffTargets
from app_toolkit._runtime.routing import caller_metrics
from app_toolkit._runtime.tables import Table
from app_toolkit.config import HTTPOptions
from app_toolkit.metrics import FamilySnapshot

logger = logging.getLogger("app_toolkit.proxy")

T = TypeVar("T")


#: Attempts of a restarted proxy's call to itself that starts it serving again.
_RESUME_RETRIES = 5


class ProxyActor:
    """Runs the proxy ASGI app under uvicorn on this node.

    The controller's fleet calls ``ready`` to start it. When Ray restarts the process
    (it died), the proxy starts again by itself, on the stored port and from the stored
    tables, so it serves even while the controller is down too.
    """

    def __init__(self, http: HTTPOptions) -> None:
        configure_worker()
        self._http = http
        self._server: ProxyServer | None = None
        self._front: HTTPFront | None = None
        self._node: NodeMetrics | None = None
        self._starting = asyncio.Lock()
        self._stopped = False  # stop() came: a start still waiting for routes does not listen
        self._routeless = False  # it listened on a shared port before its routes came
        caller_metrics.set_caller("proxy")
        context = ray.get_runtime_context()
        with warnings.catch_warnings():  # Ray's own properties use its deprecated actor_id
            warnings.simplefilter("ignore", DeprecationWarning)
            #: Ray restarted this process (it died): whichever call starts it serving
            #: (``resume``, or the controller's ``ready`` if it comes first), it starts
            #: from the stored tables, not with no routes until the controller answers.
            self._restarted = bool(context.was_current_actor_reconstructed)
            if self._restarted:
                # Retried: sent while Ray still reports this actor as restarting, the call
                # can fail at once ("The actor is restarting"), and the proxy would then
                # wait for the controller instead of serving from the stored tables.
                context.current_actor.resume.options(max_task_retries=_RESUME_RETRIES).remote()

    async def ready(self, port: int, exclusive: bool, routes_wait_s: float) -> tuple[str, int]:
        """Serve on ``port`` (idempotent); returns this proxy's URL and port. Joining
        other proxies on it (not ``exclusive``), it first waits up to ``routes_wait_s``
        for its routes."""
        server = await self._serve(port, exclusive, routes_wait_s)
        host = self._http.host
        if host in ("0.0.0.0", "::", ""):  # listening everywhere: name the node's address
            host = node_address()
        if ":" in host:
            host = f"[{host}]"
        scheme = "https" if self._http.client_tls is not None else "http"
        return f"{scheme}://{host}:{server.port}", server.port

    async def resume(self) -> None:
        """After Ray restarted this process: serve again on the stored port, from the
        stored tables until the controller answers."""
        port = stored.load_proxy_port()
        if port is None:
            return  # never served: the controller's fleet will call ready()
        try:
            await self._serve(port, exclusive=False, routes_wait_s=ROUTES_WAIT_S)
        except Exception:
            logger.exception("Restarted, but could not serve on port %d yet", port)

    def _stored_seed(self, port: int) -> dict[str, Table] | None:
        """The tables a restarted proxy serves from until the controller answers."""
        tables = stored.load_tables() if self._restarted else None
        if tables is None:
            return None
        stored_at, seed = tables
        logger.info(
            "Restarted: serving on port %d from the tables stored %.1f s ago until the controller answers",
            port,
            time.time() - stored_at,
        )
        return seed

    async def _serve(self, port: int, exclusive: bool, routes_wait_s: float) -> ProxyServer:
        async with self._starting:
            if self._server is None:
                if self._stopped:
                    raise RuntimeError("The proxy was stopped: it does not serve again")
                seed = self._stored_seed(port)
                sock = listen_socket(self._http.host, port, exclusive=exclusive)
                plane = link.attach(asyncio.get_running_loop()).data_plane
                if seed is not None:
                    plane.subscriber.seed(seed)
                node = self._node = NodeMetrics()
                proxy = self._front = HTTPFront(plane.subscriber, self._http, node.gather, node.status)
                # Connections go to the node's ingress replicas where they take them.
                node_id = ray.get_runtime_context().get_node_id()
                routes = HandoffTargets(lambda: proxy.apps, proxy.subscriber.dispatcher, node_id, proxy.keys)
                if not exclusive and routes_wait_s > 0:  # others may serve the port: join it routed
                    self._routeless = not await _routes_loaded(proxy, port, routes_wait_s)
                    if self._stopped:
                        sock.close()
                        raise RuntimeError("The proxy was stopped while it waited for its routes")
                else:
                    self._routeless = not exclusive and not proxy.ready.is_set()
                http = self._http

                def hand_off(listener: socket.socket, adopt: Adopter) -> DirectListener:
                    return DirectListener(
                        listener, adopt, routes, http.keep_alive_timeout_s, http.max_connections
                    )

                # HTTPS: the proxy ends TLS and serves every request (a TLS session cannot be
                # handed to another process): no direct ingress.
                direct = hand_off if http.client_tls is None else None
                self._server = await serve(proxy, http, sock, proxy.close, proxy.stopped, direct)
                stored.save_proxy_port(self._server.port)
                settle_heap()
            return self._server

    async def holds(self, key: str, version: int, timeout_s: float) -> bool:
        """Whether this proxy routes by ``key``'s table at ``version`` or later (waits up
        to ``timeout_s``). A proxy not serving yet loads the latest before it serves."""
        if self._front is None:
            return True
        return await self._front.subscriber.holds(key, version, timeout_s)

    async def stats(self) -> dict[str, int]:
        """Asyncio tasks alive, the process id, the connections it handed to local
        ingress replicas or served itself, whether its node is leaving (1) and whether it
        listened before its routes came (1) (for leak checks and tests)."""
        listener = self._server.listener if self._server is not None else None
        acceptor = listener.acceptor if isinstance(listener, DirectListener) else None
        return {
            "tasks": len(asyncio.all_tasks()),
            "pid": os.getpid(),
            "handed_off": acceptor.handed if acceptor is not None else 0,
            "served": acceptor.served if acceptor is not None else 0,
            "leaving": int(self._front is not None and self._front.leaving),
            "routeless": int(self._routeless),
        }

    async def gather(self) -> list[list[FamilySnapshot]]:
        """The metrics of this node's toolkit processes, as /-/metrics shows them (the
        node's ingress replicas answer /-/metrics with this on the connections they own)."""
        return await (self._node or NodeMetrics()).gather()

    async def stop(self) -> None:
        """Stop accepting connections and finish open ones (bounded), then stop following
        the controller: the fleet retires this proxy next, and the controller may be going
        too (a shutdown), which a poll still under way would log as unreachable."""
        self._stopped = True
        if self._server is not None:
            await self._server.stop(timeout_s=10)
        if self._front is not None:
            link.attach(asyncio.get_running_loop()).data_plane.close()

    async def leave(self) -> None:
        """The node is leaving: /-/healthz answers 503 from now on (load balancers send
        elsewhere); requests are still served until the fleet stops this proxy."""
        if self._front is not None:
            self._front.leaving = True


async def _routes_loaded(front: HTTPFront, port: int, wait_s: float) -> bool:
    """Wait up to ``wait_s`` until ``front`` has its routes (whether it has). Proxies of
    one machine's nodes share a port, and the kernel gives a listening socket its share of
    new connections at once: one listening before its routes arrive would answer them 503
    while the others serve."""
    try:
        await asyncio.wait_for(front.ready.wait(), wait_s)
    except TimeoutError:
        logger.warning(
            "Listening on port %d without routes: the controller did not send them within "
            "%.0f s; requests get 503 until it does",
            port,
            wait_s,
        )
        return False
    return True


class ControllerActor:
    """The named, detached controller: hosts ``ControllerCore`` and the proxy fleet.

    Every control call arrives as a function of the controller's API (``run``), the one
    way in; the other methods serve Ray-only needs (start, options, metrics, tests).
    """

    def __init__(self, http: HTTPOptions) -> None:
        configure_worker()
        self.http = http
        nodes = NodeWatch()
        self._proxies = ProxyFleet(ProxyActor, http, nodes)
        self._spares = SparePool(
            ReplicaActor,
            spare_setting(),
            lambda: code_to_preload(self.core.deployments.values()),
            nodes,
        )
        self.core = ControllerCore(
            RayReplicas(self._proxies, nodes, self._spares),
            self._proxies.states,
            heap=HeapKeeper(),
            spares=self._spares.counts,
        )
        self._started = False
        self._core_started = False
        self._start_lock: asyncio.Lock | None = None
        self._port = 0

    async def ready(self) -> int:
        """Start the loop and the proxies once; returns the proxies' port."""
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if not self._started:
                # After a restart (Ray restarts this actor when it dies) core.start() reloads
                # the checkpoint and adopts the replicas of the previous life that still run.
                if not self._core_started:
                    await self.core.start()  # stops the spares of a previous life
                    self._core_started = True
                self._spares.start()
                self._port = await self._proxies.start()
                self._started = True
        return self._port

    async def run(self, request: ControlCall[T]) -> T:
        """One control call. The core runs first: after a restart, the first caller may
        be a proxy's long poll rather than a driver."""
        await self.ready()
        return await request(self.core)

    def http_options(self) -> HTTPOptions:
        return self.http

    def stats(self) -> dict[str, int]:
        """The process id (for fault tests); answers before the core has started."""
        return {"pid": os.getpid()}

    def metrics(self) -> tuple[str, list[FamilySnapshot]]:
        """This node's id and this process's metrics (for the node's proxy)."""
        return ray.get_runtime_context().get_node_id(), metrics.snapshot()
