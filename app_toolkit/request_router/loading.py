"""Making a deployment's request router from its import path and kwargs: where the config
checks it (once, when it is given) and where each caller makes its own."""

from __future__ import annotations

import inspect
from typing import Any

from app_toolkit.exceptions import ConfigError
from app_toolkit.import_path import import_attr
from app_toolkit.request_router import RequestRouter


def make_router(path: str, kwargs: dict[str, Any]) -> RequestRouter:
    """A router of the class at ``path``, its state initialized with ``kwargs``; a
    ValueError naming the fix when the class cannot be imported or made."""
    try:
        router_class = import_attr(path)
    except ConfigError as exc:
        raise ValueError(f"{exc}; the class must be importable wherever requests are routed") from None
    if not (isinstance(router_class, type) and issubclass(router_class, RequestRouter)):
        raise ValueError(f"{path} is not a subclass of app_toolkit.request_router.RequestRouter")
    for name in ("choose_replicas", "on_request_routed", "update_replicas", "initialize_state"):
        if inspect.iscoroutinefunction(getattr(router_class, name)):
            raise ValueError(
                f"{path}.{name} is async; make it a plain def: routing runs on the caller's event "
                "loop and never waits (docs/routing.md)"
            )
    try:
        router = router_class()
        router.initialize_state(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path} refused request_router_kwargs {kwargs}: {exc}") from None
    return router
