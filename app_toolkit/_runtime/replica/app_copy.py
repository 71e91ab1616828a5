"""A copy of a Starlette or FastAPI app that a replica (or ``@ingress``) may change
without changing the user's object: it shares the routes, state and settings, and owns
its route list, exception handlers, middleware list and router stack."""

from __future__ import annotations

import copy
import logging
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.types import ASGIApp

from app_toolkit.exceptions import ConfigError

logger = logging.getLogger("app_toolkit")

S = TypeVar("S", bound=Starlette)


def serving_copy(app: ASGIApp) -> ASGIApp:
    """What a replica serves of ``app``: a Starlette or FastAPI app's :func:`own_copy`,
    any other ASGI app as it is (the replica changes only Starlette apps); the app itself
    if its router's middleware cannot be copied (said in the log)."""
    if not isinstance(app, Starlette):
        return app
    try:
        return own_copy(app)
    except ConfigError as exc:
        logger.warning("Serving the app itself, not a copy: %s", exc)
        return app


def own_copy(app: S) -> S:
    """``app`` with a router, route list, exception handlers and middleware of its own:
    routes added, handlers installed or middleware built on the copy leave ``app`` as
    it was (on the local backend the replica would otherwise serve the user's object)."""
    own = copy.copy(app)
    own.router = copy.copy(app.router)
    own.router.routes = list(app.router.routes)
    # Starlette's router dispatches through a stack bound to itself (with the router's
    # own middleware around it, e.g. FastAPI's max_body_size): bind the copy's.
    stack = _rebound(app.router.middleware_stack, app.router.app, own.router.app)
    if stack is None:
        raise ConfigError(
            "The app's router has middleware that cannot be copied (a layer that does not keep "
            "the next one as .app); move it to app.add_middleware(...)"
        )
    own.router.middleware_stack = stack
    own.exception_handlers = dict(app.exception_handlers)
    own.user_middleware = list(app.user_middleware)
    own.middleware_stack = None  # built from the copy's own list on its first request
    return own


def _rebound(stack: object, inner: object, replacement: object) -> Any | None:
    """``stack`` (middleware around ``inner``, each layer keeping the next as ``.app``, as
    Starlette's do) made again of copies of its layers around ``replacement``; None if a
    layer keeps the next one elsewhere."""
    layers: list[Any] = []
    current: Any = stack
    while current != inner:  # == : each read of a bound method makes a new one
        following = getattr(current, "app", None)
        if following is None or len(layers) >= 64:
            return None
        layers.append(current)
        current = following
    rebuilt: Any = replacement
    for layer in reversed(layers):
        clone = copy.copy(layer)
        clone.app = rebuilt
        rebuilt = clone
    return rebuilt
