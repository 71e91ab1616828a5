"""The Ray backend's shells: the controller and proxy actors, and the driver's session.

Ray is the control plane and the engine: the controller, proxy and replicas are Ray
actors (placement, resources, restarts), desired state lives in Ray's GCS key-value store,
control calls are actor calls. Requests travel over the channel (``channel.py``). Only
this module, ``ray_replicas.py``, ``ray_proxies.py`` and ``ray_cluster.py`` import ``ray``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from app_toolkit._runtime.channel import ChannelClient
from app_toolkit._runtime.controller import ControllerCore
from app_toolkit._runtime.dispatcher import ReplicaClient
from app_toolkit._runtime.messages import AppSpec, DeploymentID, ReplicaInfo
from app_toolkit._runtime.proxy import Proxy
from app_toolkit._runtime.proxy_server import ProxyServer, listen_socket, serve
from app_toolkit._runtime.ray_cluster import (
    CONTROLLER_NAME,
    NAMESPACE,
    configure_worker_logging,
    dumps,
    head_node_id,
    init_ray,
    named_actors,
    node_address,
    remote,
)
from app_toolkit._runtime.ray_proxies import ProxyFleet
from app_toolkit._runtime.ray_replicas import RayReplicas
from app_toolkit._runtime.session import Session
from app_toolkit.config import HTTPOptions
from app_toolkit.exceptions import ConfigError
from app_toolkit.status import ServeStatus

_CONTROLLER_RESTART_WAIT_S = 60.0
logger = logging.getLogger("app_toolkit.ray")


class ProxyActor:
    """Runs the proxy ASGI app under uvicorn on this node."""

    def __init__(self, http: HTTPOptions) -> None:
        configure_worker_logging()
        self._http = http
        self._server: ProxyServer | None = None
        self._starting = asyncio.Lock()

    async def ready(self, port: int, exclusive: bool) -> tuple[str, int]:
        """Serve on ``port`` (idempotent); returns this proxy's URL and port."""
        async with self._starting:
            if self._server is None:
                sock = listen_socket(self._http.host, port, exclusive=exclusive)
                proxy = Proxy(RaySession.attach().subscriber(), self._http.max_request_body_bytes,
                              self._http.access_log)
                self._server = await serve(proxy, self._http, sock)
        host = self._http.host
        if host in ("0.0.0.0", "::", ""):  # listening everywhere: name the node's address
            host = node_address()
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self._server.port}", self._server.port

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
        configure_worker_logging()
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

    # Every call first makes sure the core runs: after a restart, the first caller may be a
    # proxy's long poll rather than a driver.

    async def deploy_app(self, spec: AppSpec) -> None:
        await self.ready()
        await self.core.deploy_app(spec)

    async def delete_app(self, name: str) -> None:
        await self.ready()
        await self.core.delete_app(name)

    async def app_exists(self, name: str) -> bool:
        await self.ready()
        return self.core.app_exists(name)

    async def status(self) -> ServeStatus:
        await self.ready()
        return self.core.status()

    async def listen(self, known: dict[str, int], timeout_s: float) -> dict[str, tuple[int, Any]]:
        await self.ready()
        return await self.core.listen(known, timeout_s)

    async def record_load(self, caller: str, loads: dict[DeploymentID, float]) -> None:
        await self.ready()
        self.core.record_load(caller, loads)

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


# ------------------------------------------------------------------------------- session


class RaySession(Session):
    """Talks to the controller actor; data over channel connections."""

    backend_name = "ray"

    def __init__(self, controller: Any) -> None:
        super().__init__()
        self.controller = controller

    @classmethod
    def attach(cls) -> RaySession:
        """In a Ray worker: the process-wide session (the controller must exist)."""
        from app_toolkit._runtime.session import current_session, set_current_session

        session = current_session(create=False)
        if session is None:
            session = cls(ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE))
            set_current_session(session)
        return session  # type: ignore[return-value]

    @classmethod
    def for_process(cls) -> RaySession:
        """Inside an actor (a replica using a handle): attach without blocking calls;
        in a driver: join or start Ray and the controller."""
        if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
            return cls(ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE))
        return cls.connect()

    @classmethod
    def connect(cls, address: str | None = None, http: HTTPOptions | None = None) -> RaySession:
        """Join or start Ray, then find or start the controller and its proxy."""
        init_ray(address)
        # The controller (and a HeadOnly proxy) lives on the head node: the node whose loss
        # ends the cluster anyway, so worker nodes can come and go.
        controller = remote(
            ControllerActor, name=CONTROLLER_NAME, namespace=NAMESPACE, lifetime="detached", max_restarts=-1,
            get_if_exists=True, scheduling_strategy=NodeAffinitySchedulingStrategy(head_node_id(), soft=False),
        ).remote(http or HTTPOptions())
        running = ray.get(controller.http_options.remote())
        if http is not None and running != http:
            raise ConfigError(
                f"The toolkit already runs with HTTP options {running.model_dump()}; shut it down "
                f"first (app-toolkit shutdown) to use {http.model_dump()}"
            )
        ray.get(controller.ready.remote())
        return cls(controller)

    @classmethod
    def find(cls, address: str | None = None) -> RaySession | None:
        """The running toolkit on the cluster, or None (never starts anything)."""
        if not ray.is_initialized():
            if address is None and not os.environ.get("RAY_ADDRESS"):
                return None
            init_ray(address)
        try:
            controller = ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE)
        except ValueError:
            return None
        return cls(controller)

    def replica_client(self, info: ReplicaInfo) -> ReplicaClient:
        return ChannelClient(info.host, info.port, info.token, dumps)

    async def listen(self, known: dict[str, int], timeout_s: float) -> dict[str, tuple[int, Any]]:
        return await self.controller.listen.remote(known, timeout_s)  # type: ignore[no-any-return]

    async def report_load(self, caller: str, loads: dict[DeploymentID, float]) -> None:
        await self.controller.record_load.remote(caller, loads)

    def serialize(self, value: Any) -> bytes:
        return dumps(value)

    def _control(self, method: str, *args: Any) -> Any:
        """A controller call; while Ray restarts the controller, wait and retry."""
        deadline = time.monotonic() + _CONTROLLER_RESTART_WAIT_S
        while True:
            try:
                return ray.get(getattr(self.controller, method).remote(*args))
            except RayTaskError as exc:
                raise (exc.cause or exc) from None
            except ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def deploy(self, spec: AppSpec) -> None:
        self._control("deploy_app", spec)

    def delete(self, name: str) -> None:
        self._control("delete_app", name)

    def app_gone(self, name: str) -> bool:
        return not self._control("app_exists", name)

    def status(self) -> ServeStatus:
        return self._control("status")  # type: ignore[no-any-return]

    def proxy_url(self) -> str:
        return next(iter(self.status().proxies.values()), "")

    def shutdown(self) -> None:
        try:
            ray.get(self.controller.shutdown.remote(), timeout=120)
        except GetTimeoutError:
            logger.warning("The controller did not finish shutting down in 120 s")
        ray.kill(self.controller, no_restart=True)
        self.close_subscribers()
        # ray.kill only asks; return once every toolkit actor is really gone.
        deadline = time.monotonic() + 30
        while named_actors() and time.monotonic() < deadline:
            time.sleep(0.05)
        if named_actors():
            logger.warning("Toolkit actors still alive after shutdown: %s", named_actors())
