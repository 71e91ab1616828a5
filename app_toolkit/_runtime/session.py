"""A process's connection to the running toolkit: control calls to the controller over a
link, and the process's data plane.

There is one :class:`Session` class. What differs between backends is its
:class:`ControlLink`: how a :data:`~app_toolkit._runtime.controller.api.ControlCall`
reaches the controller (an actor call on Ray, the controller's loop in this process),
how user code is serialized, how replicas are reached and where applications are built.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from starlette.types import ASGIApp

from app_toolkit._runtime.controller.api import ConfigFile, ControlCall
from app_toolkit._runtime.messages import AppSpec, ReplicaInfo
from app_toolkit._runtime.quotas import Charges, QuotaAsk, QuotaGrant
from app_toolkit._runtime.routing.data_plane import DataPlane
from app_toolkit._runtime.routing.replica_client import ReplicaClient
from app_toolkit._runtime.tables import Loads, Outcomes, Updates, Versions
from app_toolkit.config import RolloutOptions
from app_toolkit.exceptions import RequestLostError
from app_toolkit.status import ServeStatus

logger = logging.getLogger("app_toolkit")

T = TypeVar("T")

#: How user code and arguments become bytes for the replicas (the controller never
#: imports them).
Serialize = Callable[[object], bytes]

#: The controller stops every application and proxy within this, or is stopped anyway.
SHUTDOWN_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Build:
    """One application to build where its replicas will run (on Ray: in a task under
    its ``runtime_env``), so the import is proven there. ``make`` must be picklable."""

    name: str
    runtime_env: dict[str, Any]
    make: Callable[[Serialize], AppSpec]


class ControlLink(Protocol):
    """What a backend gives a session."""

    @property
    def backend_name(self) -> str: ...

    @property
    def proxy_app(self) -> ASGIApp | None:
        """The proxy as an ASGI app in this process (local backend), else None."""
        ...

    def call(self, request: ControlCall[T], timeout_s: float | None = None) -> T:
        """Run ``request`` on the controller and block for its result (never inside the
        toolkit's own event loops)."""
        ...

    async def acall(self, request: ControlCall[T]) -> T:
        """Run ``request`` on the controller, from the data plane's loop."""
        ...

    def serialize(self, value: object) -> bytes: ...

    def connect(self, info: ReplicaInfo) -> ReplicaClient:
        """A caller's way to one replica."""
        ...

    @property
    def lost_error(self) -> type[RequestLostError]:
        """What a request lost with its replica raises: on Ray, also a RayActorError."""
        ...

    def build(self, builds: Sequence[Build]) -> list[AppSpec]:
        """Build applications where their replicas run; a ConfigError names every failure."""
        ...

    def close(self) -> None:
        """The controller has shut down (or this process leaves): release what the link holds."""
        ...


class Session:
    """This process's session: control calls (blocking) and the data plane."""

    def __init__(self, link: ControlLink, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._link = link
        self._loop = loop  # the data plane's loop; None: a thread of its own, when first used
        self._plane: DataPlane | None = None
        self._lock = threading.Lock()

    @property
    def link(self) -> ControlLink:
        return self._link

    @property
    def backend_name(self) -> str:
        return self._link.backend_name

    @property
    def proxy_app(self) -> ASGIApp | None:
        return self._link.proxy_app

    @property
    def data_plane(self) -> DataPlane:
        """Where this process's handle calls and proxied requests run."""
        with self._lock:
            if self._plane is None:
                self._plane = DataPlane(self, self._loop)
            return self._plane

    def serialize(self, value: object) -> bytes:
        return self._link.serialize(value)

    # --- what the data plane needs (CallerLink) ---------------------------------

    def connect(self, info: ReplicaInfo) -> ReplicaClient:
        return self._link.connect(info)

    @property
    def lost_error(self) -> type[RequestLostError]:
        return self._link.lost_error

    async def listen(self, known: Versions, timeout_s: float) -> Updates:
        return await self._link.acall(lambda c: c.listen(known, timeout_s))

    async def report_load(self, caller: str, loads: Loads, outcomes: Outcomes = ()) -> None:
        await self._link.acall(lambda c: c.record_load(caller, loads, outcomes))

    async def take_quota(
        self, front: str, asks: tuple[QuotaAsk, ...], charges: Charges = ()
    ) -> tuple[QuotaGrant, ...]:
        return await self._link.acall(lambda c: c.take_quota(front, asks, charges))

    # --- control ----------------------------------------------------------------

    def deploy(self, *specs: AppSpec) -> None:
        """Run these applications, all in one step of the controller."""
        self._link.call(lambda c: c.deploy_apps(list(specs)))

    def delete(self, name: str) -> None:
        self._link.call(lambda c: c.delete_app(name))

    def set_traffic(self, endpoint: str, weights: dict[str, float]) -> None:
        self._link.call(lambda c: c.set_traffic(endpoint, weights))

    def rollout(self, endpoint: str, canary: str, options: RolloutOptions) -> None:
        self._link.call(lambda c: c.rollout(endpoint, canary, options))

    def shadow(self, endpoint: str, to: str | None, fraction: float, compare: str = "") -> None:
        self._link.call(lambda c: c.shadow(endpoint, to, fraction, compare))

    def apply_config(self, specs: list[AppSpec], config_file: ConfigFile) -> None:
        self._link.call(lambda c: c.apply_config(specs, config_file))

    def config_file(self) -> ConfigFile | None:
        return self._link.call(lambda c: c.config_file())

    def status(self) -> ServeStatus:
        return self._link.call(lambda c: c.status())

    def app_gone(self, name: str) -> bool:
        """True once ``name`` is deleted and all its replicas have stopped."""
        return not self._link.call(lambda c: c.app_exists(name))

    def build(self, builds: Sequence[Build]) -> list[AppSpec]:
        return self._link.build(builds)

    def shutdown(self) -> None:
        """Stop every application, the proxies and the controller."""
        try:
            self._link.call(lambda c: c.shutdown(), timeout_s=SHUTDOWN_TIMEOUT_S)
        except TimeoutError:
            logger.warning("The controller did not finish shutting down in %s s", SHUTDOWN_TIMEOUT_S)
        if self._plane is not None:
            self._plane.close()
        self._link.close()
