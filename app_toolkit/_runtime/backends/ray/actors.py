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
import time
import warnings
from typing import Any

import ray

from app_toolkit import metrics
from app_toolkit._runtime.backends.ray import stored
from app_toolkit._runtime.backends.ray.cluster import configure_worker, node_address, settle_heap
from app_toolkit._runtime.backends.ray.node_metrics import NodeMetrics
from app_toolkit._runtime.backends.ray.proxies import ProxyFleet
from app_toolkit._runtime.backends.ray.replicas import RayReplicas
from app_toolkit._runtime.backends.ray.session import RaySession
from app_toolkit._runtime.controller.controller import ControllerCore
from app_toolkit._runtime.controller.rollout import RolloutOptions
from app_toolkit._runtime.messages import AppSpec
from app_toolkit._runtime.proxy.proxy import Proxy
from app_toolkit._runtime.proxy.server import ProxyServer, listen_socket, serve
from app_toolkit._runtime.routing import caller_metrics
from app_toolkit._runtime.tables import Loads, Outcomes, Table, Updates, Versions
from app_toolkit.config import HTTPOptions
from app_toolkit.metrics import FamilySnapshot
from app_toolkit.status import ServeStatus

logger = logging.getLogger("app_toolkit.proxy")


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
        self._starting = asyncio.Lock()
        caller_metrics.set_caller("proxy")
        context = ray.get_runtime_context()
        with warnings.catch_warnings():  # Ray's own properties use its deprecated actor_id
            warnings.simplefilter("ignore", DeprecationWarning)
            if context.was_current_actor_reconstructed:
                context.current_actor.resume.remote()

    async def ready(self, port: int, exclusive: bool) -> tuple[str, int]:
        """Serve on ``port`` (idempotent); returns this proxy's URL and port."""
        server = await self._serve(port, exclusive, seed=None)
        host = self._http.host
        if host in ("0.0.0.0", "::", ""):  # listening everywhere: name the node's address
            host = node_address()
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{server.port}", server.port

    async def resume(self) -> None:
        """After Ray restarted this process: serve again on the stored port, from the
        stored tables until the controller answers."""
        port = stored.load_proxy_port()
        if port is None:
            return  # never served: the controller's fleet will call ready()
        tables = stored.load_tables()
        seed = None
        if tables is not None:
            stored_at, seed = tables
            logger.info(
                "Restarted: serving on port %d from the tables stored %.1f s ago until the "
                "controller answers",
                port,
                time.time() - stored_at,
            )
        try:
            await self._serve(port, exclusive=False, seed=seed)
        except Exception:
            logger.exception("Restarted, but could not serve on port %d yet", port)

    async def _serve(self, port: int, exclusive: bool, seed: dict[str, Table] | None) -> ProxyServer:
        async with self._starting:
            if self._server is None:
                sock = listen_socket(self._http.host, port, exclusive=exclusive)
                plane = RaySession.attach(asyncio.get_running_loop()).data_plane
                if seed is not None:
                    plane.subscriber.seed(seed)
                node = NodeMetrics()
                proxy = Proxy(plane.subscriber, self._http, node.gather, node.status)
                self._server = await serve(proxy, self._http, sock, proxy.close, proxy.flush_logs)
                stored.save_proxy_port(self._server.port)
                settle_heap()
            return self._server

    async def stats(self) -> dict[str, int]:
        """Asyncio tasks alive and the process id (for leak checks and tests)."""
        return {"tasks": len(asyncio.all_tasks()), "pid": os.getpid()}

    async def stop(self) -> None:
        """Stop accepting connections and finish open ones (bounded), then return."""
        if self._server is not None:
            await self._server.stop(timeout_s=10)


class ControllerActor:
    """The named, detached controller: wraps ``ControllerCore`` and the proxies."""

    def __init__(self, http: HTTPOptions) -> None:
        configure_worker()
        self.http = http
        self.core = ControllerCore(RayReplicas())
        self._started = False
        self._core_started = False
        self._start_lock: asyncio.Lock | None = None
        self._proxies = ProxyFleet(ProxyActor, http, self.core.proxies)
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
                    await self.core.start()
                    self._core_started = True
                self._port = await self._proxies.start()
                self._started = True
        return self._port

    def http_options(self) -> HTTPOptions:
        return self.http

    def stats(self) -> dict[str, int]:
        """The process id (for fault tests); answers before the core has started."""
        return {"pid": os.getpid()}

    def metrics(self) -> tuple[str, list[FamilySnapshot]]:
        """This node's id and this process's metrics (for the node's proxy)."""
        return ray.get_runtime_context().get_node_id(), metrics.snapshot()

    # Every call first makes sure the core runs: after a restart, the first caller may be a
    # proxy's long poll rather than a driver.

    async def deploy_app(self, spec: AppSpec) -> None:
        await self.ready()
        await self.core.deploy_app(spec)

    async def delete_app(self, name: str) -> None:
        await self.ready()
        await self.core.delete_app(name)

    async def set_traffic(self, endpoint: str, weights: dict[str, float]) -> None:
        await self.ready()
        await self.core.set_traffic(endpoint, weights)

    async def rollout(self, endpoint: str, canary: str, options: RolloutOptions) -> None:
        await self.ready()
        await self.core.rollout(endpoint, canary, options)

    async def shadow(self, endpoint: str, to: str | None, fraction: float, compare: str = "") -> None:
        await self.ready()
        await self.core.shadow(endpoint, to, fraction, compare)

    async def apply_config(self, specs: list[AppSpec], config_file: dict[str, Any]) -> None:
        await self.ready()
        await self.core.apply_config(specs, config_file)

    async def config_file(self) -> dict[str, Any] | None:
        await self.ready()
        return self.core.config_file

    async def app_exists(self, name: str) -> bool:
        await self.ready()
        return self.core.app_exists(name)

    async def status(self) -> ServeStatus:
        await self.ready()
        return self.core.status()

    async def listen(self, known: Versions, timeout_s: float) -> Updates:
        await self.ready()
        return await self.core.listen(known, timeout_s)

    async def record_models(self, replica_id: str, models: tuple[str, ...], sequence: int) -> None:
        await self.ready()
        self.core.record_models(replica_id, models, sequence)

    async def record_load(self, caller: str, loads: Loads, outcomes: Outcomes = ()) -> None:
        await self.ready()
        self.core.record_load(caller, loads, outcomes)

    async def shutdown(self) -> None:
        await self.ready()
        for name in list(self.core.apps):
            await self.core.delete_app(name)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while self.core.deployments and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await self.core.backend.save_checkpoint(b"")
        await self._proxies.stop()
        await self.core.stop()
        stored.forget_serving_state()
