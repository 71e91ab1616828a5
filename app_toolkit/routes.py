"""Per-route options on ordinary FastAPI endpoints: ``@replicated``, ``@deadline`` and
``@open_route``.

``@replicated(...)`` gives one route its own replica pool: a deployment with its own
options that serves only that route, while the rest of the app stays in the ingress::

    @router.post("/chat")
    @tk.replicated(num_replicas=4, max_ongoing_requests=8)
    async def chat(body: ChatRequest) -> tk.ChatCompletionStream: ...

``@deadline(seconds)`` cancels a route's request after ``seconds`` and answers 504.

``@open_route`` lets a route's requests in without an API key when ``http_options`` has
keys (a sign-in page, a status probe).

They only mark the endpoint function; :func:`app_toolkit.route_table.route_table` reads
the marks when the application is built. The decorators work above or below
``@router.get(...)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from app_toolkit.config import NAME_RE, parse_deployment_config
from app_toolkit.exceptions import ConfigError

F = TypeVar("F", bound=Callable[..., Any])

_ATTR = "__app_toolkit_route__"


@dataclass(frozen=True)
class RouteOptions:
    """What the decorators recorded on one endpoint."""

    pool: str | None = None  # name of the route's own deployment
    pool_options: tuple[tuple[str, object], ...] = ()  # its deployment options, sorted
    deadline_s: float | None = None
    keyless: bool = False


def replicated(*, name: str | None = None, **deployment_options: object) -> Callable[[F], F]:
    """Serve this route from its own replica pool.

    ``deployment_options`` are those of :func:`~app_toolkit.deployment` (``num_replicas``,
    ``max_ongoing_requests``, ``ray_actor_options``, …), validated at once. The pool is a
    deployment named ``name`` (default: the function's name) in the same application; it
    runs the whole app (middleware, dependencies, lifespan) but the proxy sends it only
    the requests of its routes. Several routes may share a pool by giving the same name
    and the same options.
    """
    parse_deployment_config(deployment_options, "options of @replicated")
    if name is not None and not NAME_RE.fullmatch(name):
        raise ConfigError(f"@replicated(name={name!r}): use letters, digits, '_', '-' and '.' only")
    options = tuple(sorted(deployment_options.items()))

    def mark(endpoint: F) -> F:
        pool = name or getattr(endpoint, "__name__", None)
        if not pool or not NAME_RE.fullmatch(pool):
            raise ConfigError("@replicated needs name=... for this endpoint")
        _set(endpoint, pool=pool, pool_options=options)
        return endpoint

    return mark


def deadline(seconds: float) -> Callable[[F], F]:
    """Cancel this route's requests after ``seconds`` and answer 504 Gateway Timeout.

    The proxy enforces it, so queueing time counts too; with an
    ``x-request-timeout-seconds`` header the earlier deadline wins.
    """
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not (0 < seconds <= 86_400 and math.isfinite(seconds))
    ):
        raise ConfigError(f"@deadline takes seconds between 0 and 86400, got {seconds!r}")

    def mark(endpoint: F) -> F:
        _set(endpoint, deadline_s=float(seconds))
        return endpoint

    return mark


def open_route(endpoint: F) -> F:
    """Serve this route without an API key when ``http_options`` has keys.

    The proxy checks keys before any app code runs, so it must know the route: the mark
    puts it in the proxy's route table. Its requests carry no key name
    (:func:`~app_toolkit.api_key_name` is None) unless they present a valid key.
    """
    _set(endpoint, keyless=True)
    return endpoint


def route_options(endpoint: object) -> RouteOptions | None:
    """The options marked on ``endpoint``, if any."""
    options = getattr(endpoint, _ATTR, None)
    return options if isinstance(options, RouteOptions) else None


def _set(endpoint: object, **changes: Any) -> None:
    if not callable(endpoint):
        raise ConfigError(f"Route decorators apply to endpoint functions, got {endpoint!r}")
    current = route_options(endpoint) or RouteOptions()
    try:
        setattr(endpoint, _ATTR, replace(current, **changes))
    except AttributeError:
        raise ConfigError(f"Cannot mark {endpoint!r}; apply the decorator to a plain function") from None
