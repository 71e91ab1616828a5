"""A process's link to the toolkit on Ray: control calls are calls of the controller
actor, requests go over channel connections to the replicas."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, TypeVar

import ray
from ray.exceptions import ActorUnavailableError, RayTaskError

from app_toolkit._runtime.backends.base import current_session, set_current_session
from app_toolkit._runtime.backends.ray.build import build_on_cluster
from app_toolkit._runtime.backends.ray.cluster import controller_actor, named_actors
from app_toolkit._runtime.backends.ray.codec import dumps
from app_toolkit._runtime.backends.ray.errors import RayRequestLostError
from app_toolkit._runtime.channel.client import ChannelClient, UnreachableReplica
from app_toolkit._runtime.channel.tls import caller_tls
from app_toolkit._runtime.controller.api import ControlCall
from app_toolkit._runtime.messages import AppSpec, ReplicaInfo
from app_toolkit._runtime.routing.replica_client import ReplicaClient
from app_toolkit._runtime.session import Build, Session
from app_toolkit.exceptions import ConfigError

logger = logging.getLogger("app_toolkit.ray")

T = TypeVar("T")

_CONTROLLER_RESTART_WAIT_S = 60.0
_ACTORS_GONE_TIMEOUT_S = 30.0


class RayLink:
    """Carries control calls to the controller actor (its ``run`` method)."""

    backend_name = "ray"
    proxy_app = None  # the proxies are actors of their own
    lost_error = RayRequestLostError

    def __init__(self, controller: Any) -> None:
        self.controller = controller

    def call(self, request: ControlCall[T], timeout_s: float | None = None) -> T:
        """A controller call; while Ray restarts the controller, wait and retry."""
        deadline = time.monotonic() + _CONTROLLER_RESTART_WAIT_S
        while True:
            try:
                result: T = ray.get(self.controller.run.remote(request), timeout=timeout_s)
                return result
            except RayTaskError as exc:
                raise (exc.cause or exc) from None
            except ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    async def acall(self, request: ControlCall[T]) -> T:
        try:
            result: T = await self.controller.run.remote(request)
        except RayTaskError as exc:
            raise (exc.cause or exc) from None
        return result

    def serialize(self, value: object) -> bytes:
        return dumps(value)

    def connect(self, info: ReplicaInfo) -> ReplicaClient:
        try:
            tls = caller_tls(info.tls)
        except ConfigError as exc:
            return UnreachableReplica(f"Cannot reach replica {info.replica_id}: {exc}")
        return ChannelClient(info.host, info.port, info.token, dumps, tls)

    def build(self, builds: Sequence[Build]) -> list[AppSpec]:
        return build_on_cluster(builds)

    def close(self) -> None:
        """After the controller's shutdown: stop its actor, and return once every toolkit
        actor is really gone (``ray.kill`` only asks)."""
        ray.kill(self.controller, no_restart=True)
        deadline = time.monotonic() + _ACTORS_GONE_TIMEOUT_S
        while named_actors() and time.monotonic() < deadline:
            time.sleep(0.05)
        if named_actors():
            logger.warning("Toolkit actors still alive after shutdown: %s", named_actors())


def attach(loop: asyncio.AbstractEventLoop) -> Session:
    """In a toolkit actor (proxy, replica), on its event loop: the process's session,
    whose data plane runs on that loop."""
    session = current_session(create=False)
    if session is not None and session.backend_name == RayLink.backend_name:
        return session
    session = Session(RayLink(controller_actor()), loop)
    set_current_session(session)
    return session
