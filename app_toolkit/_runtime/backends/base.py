"""The seams between the toolkit and where it runs, and the table that picks a backend.

- :class:`Backend`: what the controller needs to run replicas (Ray actors, or objects in
  this process).
- :class:`Session`: what a process needs to deploy applications and send requests.
- :class:`SessionFactory`: how a backend starts, joins or finds a session.

Strings select implementations, as uvicorn does for its protocols: ``"ray"`` (the
default) or ``"local"``; ``"auto"`` is whatever already runs in this process, else
``"ray"``. Only :data:`BACKENDS` names the backend modules; each is imported when first
used, so ``import app_toolkit`` never imports Ray.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from starlette.types import ASGIApp

from app_toolkit._runtime import otel
from app_toolkit._runtime.controller.rollout import RolloutOptions
from app_toolkit._runtime.messages import AdoptedReplica, AppSpec, DeploymentSpec, ReplicaInfo
from app_toolkit._runtime.routing.data_plane import DataPlane
from app_toolkit._runtime.tables import Table
from app_toolkit.config import DeploymentConfig, HTTPOptions
from app_toolkit.exceptions import ConfigError
from app_toolkit.status import ServeStatus

if TYPE_CHECKING:
    from app_toolkit.config_file import ApplicationConfig

H = TypeVar("H")  # a backend's own handle to one replica (an actor, an object)

#: Backend name -> "module:attribute" of its SessionFactory.
BACKENDS: dict[str, str] = {
    "ray": "app_toolkit._runtime.backends.ray.factory:FACTORY",
    "local": "app_toolkit._runtime.backends.local:FACTORY",
}
DEFAULT_BACKEND = "ray"


class Backend(Protocol[H]):
    """What the controller needs from where replicas run."""

    async def start_replica(self, replica_id: str, spec: DeploymentSpec, rank: int) -> tuple[ReplicaInfo, H]:
        """Start and initialize a replica; raise DeployError with the user's message."""
        ...

    async def stop_replica(self, handle: H, graceful: bool) -> None:
        """Drain (if graceful) and stop a replica; never raises."""
        ...

    async def check_health(self, handle: H, timeout_s: float) -> None:
        """Raise if the replica is unhealthy (ReplicaUnavailableError if it is gone)."""
        ...

    async def reconfigure_replica(self, handle: H, config: DeploymentConfig) -> None:
        """Apply new in-place options (user_config, limits) to a running replica."""
        ...

    async def find_replicas(self) -> list[AdoptedReplica]:
        """Replicas still running from a previous controller (stopping the unusable ones)."""
        ...

    async def save_checkpoint(self, data: bytes) -> None:
        """Persist the controller's desired state."""
        ...

    async def load_checkpoint(self) -> bytes | None:
        """The last persisted desired state, if any."""
        ...

    async def save_tables(self, tables: dict[str, Table]) -> None:
        """Persist the tables last published, for callers that start while the
        controller is down."""
        ...


class Session(Protocol):
    """A process's connection to a running toolkit: control calls (blocking) and the
    process's data plane."""

    @property
    def backend_name(self) -> str: ...

    @property
    def data_plane(self) -> DataPlane:
        """Where this process's handle calls and proxied requests run."""
        ...

    @property
    def proxy_app(self) -> ASGIApp | None:
        """The proxy as an ASGI app in this process (local backend), else None."""
        ...

    def serialize(self, value: object) -> bytes:
        """Encode user code or arguments for the replicas (the controller never imports them)."""
        ...

    def deploy(self, spec: AppSpec) -> None: ...

    def delete(self, name: str) -> None: ...

    def set_traffic(self, endpoint: str, weights: dict[str, float]) -> None: ...

    def rollout(self, endpoint: str, canary: str, options: RolloutOptions) -> None: ...

    def shadow(self, endpoint: str, to: str | None, fraction: float, compare: str = "") -> None: ...

    def status(self) -> ServeStatus: ...

    def app_gone(self, name: str) -> bool:
        """True once ``name`` is deleted and all its replicas have stopped."""
        ...

    def shutdown(self) -> None:
        """Stop every application, the proxies and the controller."""
        ...

    def build_specs(self, apps: Sequence[ApplicationConfig]) -> list[AppSpec]:
        """Import and build a config file's applications where replicas run (on Ray: in a
        task under each one's runtime_env). Raises ConfigError naming every failure."""
        ...

    def apply_config(self, specs: list[AppSpec], config_file: dict[str, Any]) -> None:
        """Run exactly these applications (others are deleted); remember the file."""
        ...

    def config_file(self) -> dict[str, Any] | None:
        """The config file last applied, less the applications changed since by hand."""
        ...


class SessionFactory(Protocol):
    """How one backend starts, joins or finds the toolkit."""

    def start(self, address: str | None, http: HTTPOptions | None) -> Session:
        """Join the running toolkit or start one. ``http``: the proxy options it must
        have (None: whatever runs, or none in-process)."""
        ...

    def find(self, address: str | None) -> Session | None:
        """The running toolkit, or None; never starts anything."""
        ...


def resolve_backend_name(name: str) -> str:
    """Validate a backend name; ``auto`` means the default."""
    if name != "auto" and name not in BACKENDS:
        choices = ", ".join(repr(choice) for choice in ("auto", *BACKENDS))
        raise ConfigError(f"backend must be one of {choices}, got {name!r}")
    return DEFAULT_BACKEND if name == "auto" else name


def session_factory(name: str) -> SessionFactory:
    """The factory of backend ``name`` (importing its module now). Runs the process's
    OpenTelemetry set-up first, if one is named (before any request can be traced)."""
    otel.setup_from_env()
    module, _, attribute = BACKENDS[resolve_backend_name(name)].partition(":")
    factory: SessionFactory = getattr(importlib.import_module(module), attribute)
    return factory


# ------------------------------------------------------------------------------ current

_current: Session | None = None
_current_lock = threading.RLock()  # a factory may set the session while creating it


def current_session(create: bool = True) -> Session | None:
    """The session of this process; with ``create``, joins (or starts) the default backend."""
    global _current
    with _current_lock:
        if _current is None and create:
            _current = session_factory(DEFAULT_BACKEND).start(None, None)
        return _current


def set_current_session(session: Session | None) -> None:
    global _current
    with _current_lock:
        _current = session
