"""The local backend: controller, replicas and proxy as asyncio objects in this process.

Same controller, replica, dispatcher and proxy code as on Ray, on one background event
loop; only the transport differs (an in-process call instead of the channel). For tests,
debugging with pdb and quick starts.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import pickle
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

from starlette.types import ASGIApp, Message

from app_toolkit._runtime.backends.cpu_threads import PROCESS_THREADS, ProcessThreads
from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.channel.flow import FRAME_COST, STREAM_WINDOW, Inbound, frame_cost
from app_toolkit._runtime.controller.api import ControlCall
from app_toolkit._runtime.controller.backend import ClusterView, Seat
from app_toolkit._runtime.controller.controller import ControllerCore
from app_toolkit._runtime.front import key_door
from app_toolkit._runtime.front.http_front import HTTPFront
from app_toolkit._runtime.front.server import ProxyServer, listen_socket, serve
from app_toolkit._runtime.loop_thread import LoopThread
from app_toolkit._runtime.messages import (
    LOST,
    STREAMED,
    AdoptedReplica,
    Answer,
    AppSpec,
    BodyChunk,
    ByValue,
    ClientMessage,
    DeploymentSpec,
    MethodCall,
    ReplicaInfo,
    Request,
    RequestBodyPiece,
    WebSocketOpen,
    beyond_limit,
    body_follows,
)
from app_toolkit._runtime.replica.replica import InitArgs, ReplicaCore
from app_toolkit._runtime.routing.data_plane import DataPlane, refuse_nested
from app_toolkit._runtime.routing.replica_client import ReplicaClient
from app_toolkit._runtime.routing.subscriber import TableSubscriber
from app_toolkit._runtime.session import Build, Session
from app_toolkit._runtime.tables import Table
from app_toolkit.config import DeploymentConfig, HTTPOptions
from app_toolkit.exceptions import ConfigError, ReplicaUnavailableError, RequestLostError

T = TypeVar("T")

logger = logging.getLogger("app_toolkit.local")
#: How long a stopped replica's requests may take to end once cancelled.
_CANCEL_TIMEOUT_S = 5.0


def _dumps(value: object) -> bytes:
    return pickle.dumps(value, 5)


class LocalBackend:
    """Starts replicas as ``ReplicaCore`` objects on the current loop."""

    def __init__(self) -> None:
        self.objects: dict[bytes, object] = {}
        self.cores: dict[str, ReplicaCore] = {}
        #: Per replica, its callers' clients, which hold the requests it runs: lost when it
        #: stops with them still running (past its grace period), as a stopped process's are.
        self.clients: dict[str, weakref.WeakSet[LocalReplicaClient]] = {}
        self._checkpoint: bytes | None = None
        #: Where replicas report their multiplexed models (the controller, once it exists).
        self.on_models: Callable[[str, tuple[str, ...], int], None] | None = None
        #: The proxy's server, when it listens.
        self.server: ProxyServer | None = None
        #: This process's tables and load reports (replicas' custom metrics go with them).
        self.subscriber: TableSubscriber | None = None
        #: The threads its replicas' numerical libraries take, as Ray would set them.
        self.threads: ProcessThreads = PROCESS_THREADS

    def store(self, value: object) -> bytes:
        """Local "serialization": keep the object, hand out a key.

        The key is the same for the same object (a class or function) or equal picklable
        arguments, so redeploying unchanged code keeps its version (no restart).
        """
        if isinstance(value, ByValue):  # nothing is pickled here: by value or not is the same
            value = value.value
        if callable(value):
            key = hashlib.sha256(b"object %d" % id(value)).digest()
        else:
            try:
                key = hashlib.sha256(pickle.dumps(value)).digest()
            except Exception:  # noqa: BLE001 - unpicklable: not comparable, a new version every time
                key = uuid.uuid4().bytes
        self.objects[key] = value
        return key

    async def start_replica(
        self, replica_id: str, spec: DeploymentSpec, seat: Seat
    ) -> tuple[ReplicaInfo, ReplicaCore]:
        core = ReplicaCore(
            replica_id,
            spec.id,
            spec.config,
            cast(Callable[..., object], self.objects[spec.definition]),
            cast(InitArgs, self.objects[spec.init_args]),
            _dumps,
            seat.place(""),  # one "node": this process
            seat.world_size,
            code_version=spec.code_version,
        )
        reports = itertools.count()
        core.report_models = lambda models: (
            self.on_models(replica_id, models, next(reports)) if self.on_models else None
        )
        self.threads.started(replica_id, spec.config.ray_actor_options.num_cpus)
        try:
            await core.start()
        except BaseException:
            self.threads.stopped(replica_id)
            raise
        self.cores[replica_id] = core
        if core.samples_stats and self.subscriber is not None:
            self.subscriber.add_stats(replica_id, core.take_stats)
        max_ongoing = spec.config.max_ongoing_requests
        info = ReplicaInfo(replica_id, spec.id, "local", 0, b"", max_ongoing, rank=seat.rank)
        return info, core

    async def stop_replica(
        self, handle: ReplicaCore, graceful: bool, hurry: bool = False, grace_s: float | None = None
    ) -> None:
        if self.subscriber is not None:
            self.subscriber.drop_stats(handle.replica_id)
        try:
            if graceful:
                await handle.drain(hurry, grace_s)
            else:
                await handle.stop_sampling()
        finally:
            self.threads.stopped(handle.replica_id)  # a failed drain must not keep the count
        self.cores.pop(handle.replica_id, None)
        tasks: list[asyncio.Task[None]] = []
        for client in self.clients.pop(handle.replica_id, ()):
            for exchange, task in list(client.serving.items()):
                if not exchange.finished:  # its caller has no answer yet: it gets the loss
                    exchange.push(LOST)
                task.cancel()
                tasks.append(task)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=_CANCEL_TIMEOUT_S)
            if pending:
                logger.warning(
                    "%d request(s) of %s did not end within %s s of being cancelled (does the "
                    "deployment catch CancelledError?)",
                    len(pending),
                    handle.replica_id,
                    _CANCEL_TIMEOUT_S,
                )

    async def cluster_view(self) -> ClusterView:
        return ClusterView()  # one process: no node leaves, every replica has room

    async def release_node(self, node_id: str) -> None:
        pass  # no nodes

    def load_object(self, data: bytes) -> object:
        return self.objects[data]

    async def check_health(self, handle: ReplicaCore, timeout_s: float) -> None:
        if handle.replica_id not in self.cores:
            raise ReplicaUnavailableError(f"Replica {handle.replica_id} was stopped")
        await asyncio.wait_for(handle.check_health(), timeout_s)

    async def reconfigure_replica(self, handle: ReplicaCore, config: DeploymentConfig) -> None:
        await handle.update_config(config)

    async def find_replicas(self) -> list[AdoptedReplica]:
        return []  # the local controller lives as long as its replicas

    async def save_checkpoint(self, data: bytes) -> None:
        self._checkpoint = data

    async def load_checkpoint(self) -> bytes | None:
        return self._checkpoint

    async def save_tables(self, tables: dict[str, Table]) -> None:
        return None  # the proxy and handles live and die with this process's controller

    async def proxies_lagging(self, key: str, version: int, timeout_s: float) -> list[str]:
        if self.subscriber is None or await self.subscriber.holds(key, version, timeout_s):
            return []  # no proxy, or it holds the table
        return ["this process"]

    async def stop_proxies(self) -> None:
        if self.server is not None:
            await self.server.stop(timeout_s=5)


class _LocalSink:
    """Hands a replica's answers straight to the caller's exchange; a stream's producer
    waits while the caller has a window's worth unconsumed (``channel/flow.py``)."""

    __slots__ = ("_exchange", "inbound")

    def __init__(self, exchange: Exchange, inbound: Inbound | None) -> None:
        self._exchange = exchange
        self.inbound = inbound

    def send(self, answer: Answer) -> None:
        if self._exchange.finished:
            return  # cancelled by its caller, or lost with its replica: it gets nothing more
        if isinstance(answer, BodyChunk):
            data = bytes(answer.data)  # the app may reuse a buffer it sent
            self._exchange.push(BodyChunk(data), frame_cost(len(data)))
        else:
            self._exchange.push(answer, FRAME_COST if isinstance(answer, STREAMED) else 0)

    async def drain(self) -> None:
        await asyncio.sleep(0)
        await self._exchange.inflow.room()


class LocalReplicaClient:
    """Calls a replica core directly, with the channel's admission and cancel semantics."""

    def __init__(self, backend: LocalBackend, replica_id: str) -> None:
        self._backend = backend
        self._replica_id = replica_id
        #: The requests this caller has running on the replica, until they end.
        self.serving: dict[Exchange, asyncio.Task[None]] = {}
        self._known = False  # listed in backend.clients (once it has had a running replica)

    async def open(self, request: Request) -> Exchange:
        core = self._backend.cores.get(self._replica_id)
        if core is None:
            raise ReplicaUnavailableError(f"Replica {self._replica_id} is not running")
        if not self._known:  # a stopped replica's key is not made again by a late client
            self._backend.clients.setdefault(self._replica_id, weakref.WeakSet()).add(self)
            self._known = True
        if isinstance(request, MethodCall):  # what pickling refuses on Ray, refused here too
            refuse_nested([*request.args, *request.kwargs.values()])
        tasks: list[asyncio.Task[None]] = []
        inbound: Inbound | None = None

        def cancel() -> None:
            for task in tasks:
                task.cancel()

        def forward(next_message: ClientMessage) -> int:
            message: Message
            if isinstance(next_message, RequestBodyPiece):
                data = bytes(next_message.data)  # the server may reuse its buffer
                message = {"type": "http.request", "body": data, "more_body": next_message.more}
                cost = frame_cost(len(data))
            else:
                message = next_message.message
                cost = frame_cost(len(message.get("bytes") or b"") + len(message.get("text") or ""))
            if inbound is not None:
                inbound.put(message, cost)
            return cost

        exchange = Exchange(cancel, forward, request=request)
        streams_body = body_follows(request)
        if isinstance(request, WebSocketOpen) or streams_body:
            inbound = Inbound(exchange.credited)
        refused = core.admit(beyond_limit(request))
        if refused is not None:
            exchange.push(refused)
            return exchange
        if streams_body:
            exchange.credited(STREAM_WINDOW)  # admitted: the rest of the body may come
        sink = _LocalSink(exchange, inbound)
        tasks.append(asyncio.get_running_loop().create_task(self._serve(core, request, sink, exchange)))
        return exchange

    async def _serve(self, core: ReplicaCore, request: Request, sink: _LocalSink, exchange: Exchange) -> None:
        # Counted once it runs (a task cancelled before its first step never enters here).
        self.serving[exchange] = cast("asyncio.Task[None]", asyncio.current_task())
        try:
            await core.serve(request, sink)
        finally:
            del self.serving[exchange]

    def close(self) -> None:
        pass


class LocalLink:
    """Everything on one background event loop of this process: control calls run on
    the controller's loop, requests are calls of the replica objects."""

    backend_name = "local"
    lost_error = RequestLostError

    def __init__(self, http: HTTPOptions | None = None) -> None:
        self._http = http or HTTPOptions()
        self._loop = LoopThread("app-toolkit-local")
        self.backend = LocalBackend()
        self.core = ControllerCore(self.backend)
        self.backend.on_models = self.core.reports.note_models
        self._loop.run(self.core.start())
        self.proxy: HTTPFront | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop.loop

    @property
    def proxy_app(self) -> ASGIApp | None:
        return self.proxy

    def serve_proxy(self, plane: DataPlane, listen: bool) -> None:
        """Make the proxy over ``plane``'s tables; with ``listen``, serve it with uvicorn
        on this link's loop too."""
        http = self._http

        async def start() -> None:
            self.backend.subscriber = plane.subscriber
            self.proxy = proxy = HTTPFront(plane.subscriber, http, status=self.core.status)
            if listen:
                sock = listen_socket(http.host, http.port, exclusive=True)
                self.backend.server = await serve(proxy, http, sock, proxy.close, proxy.stopped)

        self._loop.run(start())

    def call(self, request: ControlCall[T], timeout_s: float | None = None) -> T:
        async def run() -> T:
            return await request(self.core)

        return self._loop.run(run(), timeout_s)

    async def acall(self, request: ControlCall[T]) -> T:
        return await request(self.core)

    def serialize(self, value: object) -> bytes:
        return self.backend.store(value)

    def connect(self, info: ReplicaInfo) -> ReplicaClient:
        return LocalReplicaClient(self.backend, info.replica_id)

    def build(self, builds: Sequence[Build]) -> list[AppSpec]:
        """Build in this process, which is where the replicas run."""
        for build in builds:
            if build.runtime_env:
                raise ConfigError(
                    f"Application {build.name!r} has a runtime_env, which only the Ray backend "
                    "provides; remove it to run the file in this process"
                )
        specs = []
        for index, build in enumerate(builds):
            try:
                specs.append(build.make(self.serialize))
            except ConfigError as exc:
                raise ConfigError(f"applications[{index}] ({build.name}): {exc}") from None
        return specs

    def close(self) -> None:
        if self.proxy is not None and self.proxy.door is not None:  # the next session's keys are its own
            key_door.uninstall(self.proxy.door)
        self._loop.stop()
        self.backend.threads.forget_all()  # replicas a stopped loop never stopped


class _LocalFactory:
    """Sessions of the local backend live in this process only: nothing to find."""

    def start(self, address: str | None, http: HTTPOptions | None) -> Session:
        link = LocalLink(http)
        session = Session(link, link.loop)
        try:
            link.serve_proxy(
                session.data_plane, listen=http is not None and http.proxy_location != "Disabled"
            )
        except BaseException:
            session.shutdown()
            raise
        return session

    def find(self, address: str | None) -> Session | None:
        return None


FACTORY = _LocalFactory()
