"""A process's session on the Ray backend: control calls to the controller actor, and the
data plane (channel connections to replicas)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayTaskError

from app_toolkit._runtime.backends.base import current_session, set_current_session
from app_toolkit._runtime.backends.ray.cluster import controller_actor, dumps, named_actors
from app_toolkit._runtime.channel.client import ChannelClient, UnreachableReplica
from app_toolkit._runtime.channel.tls import caller_tls
from app_toolkit._runtime.controller.rollout import RolloutOptions
from app_toolkit._runtime.messages import AppSpec, ReplicaInfo
from app_toolkit._runtime.routing.data_plane import DataPlane
from app_toolkit._runtime.routing.dispatcher import ReplicaClient
from app_toolkit._runtime.tables import Loads, Outcomes, Updates, Versions
from app_toolkit.exceptions import ConfigError
from app_toolkit.status import ServeStatus

if TYPE_CHECKING:
    from app_toolkit.config_file import ApplicationConfig

logger = logging.getLogger("app_toolkit.ray")

_CONTROLLER_RESTART_WAIT_S = 60.0
_SHUTDOWN_TIMEOUT_S = 120.0
_ACTORS_GONE_TIMEOUT_S = 30.0


class RaySession:
    """Talks to the controller actor; requests go over channel connections."""

    backend_name = "ray"
    proxy_app = None  # the proxies are actors of their own

    def __init__(self, controller: Any, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.controller = controller
        self._loop = loop  # the data plane's loop; None: a thread of its own, when first used
        self._plane: DataPlane | None = None
        self._lock = threading.Lock()

    @classmethod
    def attach(cls, loop: asyncio.AbstractEventLoop) -> RaySession:
        """In a toolkit actor (proxy, replica), on its event loop: the process's session,
        whose data plane runs on that loop."""
        session = current_session(create=False)
        if isinstance(session, RaySession):
            return session
        session = cls(controller_actor(), loop)
        set_current_session(session)
        return session

    @property
    def data_plane(self) -> DataPlane:
        with self._lock:
            if self._plane is None:
                self._plane = DataPlane(self, self._loop)
            return self._plane

    # --- what the data plane needs (CallerLink) ---------------------------------

    def connect(self, info: ReplicaInfo) -> ReplicaClient:
        try:
            tls = caller_tls(info.tls)
        except ConfigError as exc:
            return UnreachableReplica(f"Cannot reach replica {info.replica_id}: {exc}")
        return ChannelClient(info.host, info.port, info.token, dumps, tls)

    async def listen(self, known: Versions, timeout_s: float) -> Updates:
        updates: Updates = await self.controller.listen.remote(known, timeout_s)
        return updates

    async def report_load(self, caller: str, loads: Loads, outcomes: Outcomes = ()) -> None:
        await self.controller.record_load.remote(caller, loads, outcomes)

    # --- control ----------------------------------------------------------------

    def serialize(self, value: object) -> bytes:
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

    def set_traffic(self, endpoint: str, weights: dict[str, float]) -> None:
        self._control("set_traffic", endpoint, weights)

    def rollout(self, endpoint: str, canary: str, options: RolloutOptions) -> None:
        self._control("rollout", endpoint, canary, options)

    def shadow(self, endpoint: str, to: str | None, fraction: float, compare: str = "") -> None:
        self._control("shadow", endpoint, to, fraction, compare)

    def apply_config(self, specs: list[AppSpec], config_file: dict[str, Any]) -> None:
        self._control("apply_config", specs, config_file)

    def config_file(self) -> dict[str, Any] | None:
        config: dict[str, Any] | None = self._control("config_file")
        return config

    def build_specs(self, apps: Sequence[ApplicationConfig]) -> list[AppSpec]:
        from app_toolkit._runtime.backends.ray.build import build_specs

        return build_specs(apps)

    def app_gone(self, name: str) -> bool:
        return not self._control("app_exists", name)

    def status(self) -> ServeStatus:
        status: ServeStatus = self._control("status")
        return status

    def shutdown(self) -> None:
        try:
            ray.get(self.controller.shutdown.remote(), timeout=_SHUTDOWN_TIMEOUT_S)
        except GetTimeoutError:
            logger.warning("The controller did not finish shutting down in %s s", _SHUTDOWN_TIMEOUT_S)
        ray.kill(self.controller, no_restart=True)
        if self._plane is not None:
            self._plane.close()
        # ray.kill only asks; return once every toolkit actor is really gone.
        deadline = time.monotonic() + _ACTORS_GONE_TIMEOUT_S
        while named_actors() and time.monotonic() < deadline:
            time.sleep(0.05)
        if named_actors():
            logger.warning("Toolkit actors still alive after shutdown: %s", named_actors())
