"""The table that picks a backend, and this process's session.

- :class:`SessionFactory`: how a backend starts, joins or finds the toolkit, giving a
  :class:`~app_toolkit._runtime.session.Session` over the backend's link.
- What the controller needs of a backend is ``controller/backend.py``'s ``Backend``.

Strings select implementations, as uvicorn does for its protocols: ``"ray"`` (the
default) or ``"local"``; ``"auto"`` is whatever already runs in this process, else
``"ray"``. Only :data:`BACKENDS` names the backend modules; each is imported when first
used, so ``import app_toolkit`` never imports Ray.
"""

from __future__ import annotations

import importlib
import threading
from typing import Protocol

from app_toolkit._runtime import tracing
from app_toolkit._runtime.session import Session
from app_toolkit.config import HTTPOptions
from app_toolkit.exceptions import ConfigError

#: Backend name -> "module:attribute" of its SessionFactory.
BACKENDS: dict[str, str] = {
    "ray": "app_toolkit._runtime.backends.ray.factory:FACTORY",
    "local": "app_toolkit._runtime.backends.local:FACTORY",
}
DEFAULT_BACKEND = "ray"


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
    tracing.setup_from_env()
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
