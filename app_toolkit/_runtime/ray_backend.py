"""The Ray backend: the only module that imports ``ray``.

Ray is the control plane and the engine: the controller, proxy and replicas are Ray
actors (placement, resources, restarts), desired state lives in Ray's GCS key-value store,
control calls are actor calls. Requests travel over the channel (``channel.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
import os
import pickle
import secrets
import threading
import time
from typing import Any

import ray
import uvicorn
from ray import cloudpickle
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError
from ray.experimental import internal_kv
from starlette.datastructures import State

from app_toolkit._runtime.channel import ChannelClient, start_server
from app_toolkit._runtime.controller import ControllerCore
from app_toolkit._runtime.dispatcher import ReplicaClient
from app_toolkit._runtime.messages import (
    AdoptedReplica,
    AppSpec,
    DeploymentID,
    DeploymentSpec,
    ReplicaInfo,
)
from app_toolkit._runtime.proxy import Proxy
from app_toolkit._runtime.replica import ReplicaCore
from app_toolkit._runtime.session import Session
from app_toolkit.config import DeploymentConfig, HTTPOptions
from app_toolkit.exceptions import ConfigError, DeployError, ReplicaUnavailableError
from app_toolkit.status import ServeStatus

NAMESPACE = "app_toolkit"
CONTROLLER_NAME = "app_toolkit_controller"
_CHECKPOINT_KEY = b"app_toolkit/desired_state"
_DESCRIBE_TIMEOUT_S = 10.0
_PROXY_CHECK_S = 1.0
_PROXY_CHECK_TIMEOUT_S = 30.0
_CONTROLLER_RESTART_WAIT_S = 60.0
_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))
logger = logging.getLogger("app_toolkit.ray")


# ------------------------------------------------------------------------------- codec


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, plus fresh locks and Starlette ``State`` (FastAPI apps hold both)."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is _LOCK_TYPES[0]:
            return (threading.Lock, ())
        if type(obj) is _LOCK_TYPES[1]:
            return (threading.RLock, ())
        if type(obj) is State:
            return (State, (dict(obj._state),))
        return super().reducer_override(obj)  # type: ignore[no-untyped-call]


def dumps(value: Any) -> bytes:
    """Serialize user code and data (by value where it is not importable)."""
    buffer = io.BytesIO()
    try:
        _Pickler(buffer, protocol=5).dump(value)  # type: ignore[no-untyped-call]
    except Exception as exc:
        raise ConfigError(
            f"Cannot serialize {type(value).__name__} to send it to replicas: {exc}. Keep "
            "deployment arguments picklable (plain data, handles, importable objects)."
        ) from None
    return buffer.getvalue()


def _node_address() -> str:
    """The address this Ray node was started with (127.0.0.1 on the embedded cluster).

    Not ``ray.util.get_node_ip_address()``: that returns the machine's routable address
    even when the node itself listens on loopback only.
    """
    node_id = ray.get_runtime_context().get_node_id()
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if node["NodeID"] == node_id:
            return str(node["NodeManagerAddress"])
    raise RuntimeError(f"This Ray node ({node_id}) is not in the cluster's node table")


def _configure_worker_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


# ------------------------------------------------------------------------------- actors

#: Every toolkit actor: no CPU reserved (control and I/O), many concurrent calls.
_ACTOR_DEFAULTS: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 10_000}


def _remote(cls: type, **options: Any) -> Any:
    """``cls`` as a Ray actor class with the toolkit's defaults and ``options``."""
    return ray.remote(cls).options(**{**_ACTOR_DEFAULTS, **options})


class ReplicaActor:
    """Hosts one ``ReplicaCore`` and its channel server."""

    def __init__(self, replica_id: str, deployment: DeploymentID, config: DeploymentConfig,
                 definition: bytes, init_args: bytes, code_version: str) -> None:
        _configure_worker_logging()
        self._args = (replica_id, deployment, config, definition, init_args)
        self._code_version = code_version
        self._core: ReplicaCore | None = None
        self._server: asyncio.Server | None = None
        self._info: ReplicaInfo | None = None

    async def initialize(self) -> ReplicaInfo:
        replica_id, deployment, config, definition, init_args = self._args
        core = ReplicaCore(replica_id, deployment, config, pickle.loads(definition),
                           pickle.loads(init_args), dumps)
        await core.start()
        token = secrets.token_bytes(16)
        host = _node_address()
        self._server, port = await start_server(core, host, token, dumps)
        self._core = core
        self._info = ReplicaInfo(replica_id, deployment, host, port, token, config.max_ongoing_requests)
        return self._info

    async def describe(self) -> AdoptedReplica | str:
        """What a restarted controller needs to adopt this replica, or why it cannot:
        "starting" or "draining"."""
        core = self._core
        if core is None or self._info is None:
            return "starting"
        if core.draining:
            return "draining"
        info = dataclasses.replace(self._info, max_ongoing_requests=core.config.max_ongoing_requests)
        return AdoptedReplica(info, self._code_version, core.config, None)

    async def check_health(self) -> None:
        assert self._core is not None
        await self._core.check_health()

    async def reconfigure(self, config: DeploymentConfig) -> None:
        assert self._core is not None
        await self._core.update_config(config)

    async def stats(self) -> dict[str, int]:
        """Requests running, asyncio tasks alive and the process id (for tests and tools)."""
        return {"ongoing": self._core.ongoing if self._core else 0,
                "tasks": len(asyncio.all_tasks()), "pid": os.getpid()}

    async def drain(self) -> None:
        if self._core is not None:
            await self._core.drain()
            # Callers that still have the old table may send here for a moment: refuse
            # those requests (they are retried elsewhere) rather than die under them.
            await self._core.linger()
        if self._server is not None:
            self._server.close()


class ProxyActor:
    """Runs the proxy ASGI app under uvicorn on this node."""

    def __init__(self, http: HTTPOptions) -> None:
        _configure_worker_logging()
        self._http = http
        self._host, self._port = http.host, http.port
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Task[None] | None = None

    async def ready(self) -> int:
        if self._server is None:
            session = RaySession.attach()
            proxy = Proxy(session.subscriber(), self._http.max_request_body_bytes,
                          self._http.access_log)
            config = uvicorn.Config(proxy, host=self._host, port=self._port, lifespan="off",
                                    log_level="warning", access_log=False,
                                    ws_max_size=self._http.websocket_max_message_bytes)
            self._server = uvicorn.Server(config)
            task = self._serving = asyncio.get_running_loop().create_task(self._server.serve())
            while not self._server.started:
                if task.done():
                    raise OSError(f"The proxy could not listen on {self._host}:{self._port}; "
                                  "is the port in use? Pick another with --port.")
                await asyncio.sleep(0.01)
        return int(self._server.servers[0].sockets[0].getsockname()[1])

    async def stats(self) -> dict[str, int]:
        """Asyncio tasks alive and the process id (for leak checks and tests)."""
        return {"tasks": len(asyncio.all_tasks()), "pid": os.getpid()}

    async def stop(self) -> None:
        """Stop accepting connections and finish open ones (bounded), then return."""
        if self._server is not None:
            self._server.should_exit = True
        if self._serving is not None:
            await asyncio.wait({self._serving}, timeout=10)


class _RayReplicas:
    """The controller's Backend on Ray."""

    def __init__(self) -> None:
        self._draining: set[asyncio.Future[None]] = set()

    async def start_replica(self, replica_id: str, spec: DeploymentSpec) -> tuple[ReplicaInfo, Any]:
        options = spec.config.ray_actor_options
        actor_options: dict[str, Any] = {
            "name": f"app_toolkit_replica:{replica_id}", "namespace": NAMESPACE,
            "lifetime": "detached", "num_cpus": options.num_cpus, "num_gpus": options.num_gpus,
            "resources": options.resources,
        }
        if options.memory is not None:
            actor_options["memory"] = options.memory
        if options.runtime_env is not None:
            actor_options["runtime_env"] = options.runtime_env
        actor = _remote(ReplicaActor, **actor_options).remote(
            replica_id, spec.id, spec.config, spec.definition, spec.init_args, spec.code_version)
        try:
            return await actor.initialize.remote(), actor
        except RayTaskError as exc:
            ray.kill(actor, no_restart=True)
            cause = exc.cause if exc.cause is not None else exc
            raise DeployError(str(cause)) from None
        except RayActorError as exc:
            ray.kill(actor, no_restart=True)
            raise DeployError(f"Replica process died while starting: {exc}") from None

    async def stop_replica(self, handle: Any, graceful: bool) -> None:
        if graceful:
            try:
                await handle.drain.remote()
            except Exception as exc:  # a dead replica needs no draining
                logger.info("Draining a replica failed: %s", exc)
        ray.kill(handle, no_restart=True)

    async def reconfigure_replica(self, handle: Any, config: DeploymentConfig) -> None:
        try:
            await handle.reconfigure.remote(config)
        except RayTaskError as exc:
            cause = exc.cause if exc.cause is not None else exc
            raise DeployError(str(cause)) from None

    async def check_health(self, handle: Any, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(handle.check_health.remote(), timeout_s)
        except RayActorError as exc:
            raise ReplicaUnavailableError(str(exc)) from None
        except RayTaskError as exc:
            raise RuntimeError(str(exc.cause or exc)) from None

    async def find_replicas(self) -> list[AdoptedReplica]:
        """Replicas left running by a previous controller; those that cannot say what
        they are (still starting, draining, unresponsive) are stopped."""
        found: list[AdoptedReplica] = []
        for name in _named_actors():
            if not name.startswith("app_toolkit_replica:"):
                continue
            actor = ray.get_actor(name, namespace=NAMESPACE)
            described: AdoptedReplica | str
            try:
                described = await asyncio.wait_for(actor.describe.remote(), _DESCRIBE_TIMEOUT_S)
            except Exception as exc:
                described = f"unresponsive ({exc})"
            if isinstance(described, AdoptedReplica):
                found.append(dataclasses.replace(described, handle=actor))
                continue
            logger.warning("Stopping replica %s left by a previous controller: %s", name, described)
            if described == "draining":  # let its in-flight requests finish first
                self._draining.add(asyncio.ensure_future(self.stop_replica(actor, graceful=True)))
                self._draining = {task for task in self._draining if not task.done()}
            else:
                ray.kill(actor, no_restart=True)
        return found

    async def save_checkpoint(self, data: bytes) -> None:
        internal_kv._internal_kv_put(_CHECKPOINT_KEY, data, overwrite=True, namespace=NAMESPACE)

    async def load_checkpoint(self) -> bytes | None:
        data = internal_kv._internal_kv_get(_CHECKPOINT_KEY, namespace=NAMESPACE)
        return data if data else None


class ControllerActor:
    """The named, detached controller: wraps ``ControllerCore``."""

    def __init__(self, http: HTTPOptions) -> None:
        _configure_worker_logging()
        self.http = http
        self.core = ControllerCore(_RayReplicas())
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        self._proxy: Any = None
        self._supervisor: asyncio.Task[None] | None = None

    async def ready(self) -> int:
        """Start the loop and the proxy once; returns the proxy's port."""
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if not self._started:
                # After a restart (Ray restarts this actor when it dies) core.start() reloads
                # the checkpoint and adopts the replicas of the previous life that still run.
                await self.core.start()
                node = ray.get_runtime_context().get_node_id()
                self._proxy = _remote(
                    ProxyActor, name=f"app_toolkit_proxy:{node}", namespace=NAMESPACE, lifetime="detached",
                    get_if_exists=True, max_restarts=-1,
                    scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node, soft=False),
                ).remote(self.http)
                try:
                    port = await self._proxy.ready.remote()
                except RayTaskError as exc:
                    raise ConfigError(str(exc.cause or exc)) from None
                self.core.proxies[node] = f"http://{self.http.host}:{port}"
                self._port = int(port)
                self._started = True
                self._supervisor = asyncio.get_running_loop().create_task(self._supervise_proxy(node))
        return self._port

    async def _supervise_proxy(self, node: str) -> None:
        """Ray restarts a proxy whose process died; this starts its server again (a
        restarted actor serves nothing until ``ready()``), and it re-learns the routes."""
        while True:
            await asyncio.sleep(_PROXY_CHECK_S)
            try:
                port = await asyncio.wait_for(self._proxy.ready.remote(), _PROXY_CHECK_TIMEOUT_S)
            except Exception as exc:
                logger.warning("The proxy on node %s is not serving yet (%s)", node, exc)
                continue
            self.core.proxies[node] = f"http://{self.http.host}:{port}"

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
        if self._supervisor is not None:
            self._supervisor.cancel()
        if self._proxy is not None:
            await self._proxy.stop.remote()
            ray.kill(self._proxy, no_restart=True)
        await self.core.stop()


# ------------------------------------------------------------------------------- session


def init_ray(address: str | None) -> None:
    """Join ``address`` (or RAY_ADDRESS), or start an embedded single-node cluster."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:
        # Ray runs workers at nice 15 by default; on a small machine serving replicas then
        # lose the CPU to everything else. The embedded cluster runs them at normal priority.
        os.environ.setdefault("RAY_worker_niceness", "0")
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING,
                              "configure_logging": False}
    if address is None:
        kwargs["_node_ip_address"] = "127.0.0.1"
    ray.init(address=address, **kwargs)


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
        controller = _remote(
            ControllerActor, name=CONTROLLER_NAME, namespace=NAMESPACE, lifetime="detached", max_restarts=-1,
            get_if_exists=True,
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
        while _named_actors() and time.monotonic() < deadline:
            time.sleep(0.05)
        if _named_actors():
            logger.warning("Toolkit actors still alive after shutdown: %s", _named_actors())


def _named_actors() -> list[str]:
    return [actor["name"] for actor in ray.util.list_named_actors(all_namespaces=True)
            if actor["namespace"] == NAMESPACE]
