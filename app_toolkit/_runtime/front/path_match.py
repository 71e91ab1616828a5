"""Which deployment serves a request: the app by longest prefix, then its special routes.

Pure; the proxy keeps one :class:`AppMatcher` per application. The one route match of
HTTP requests, WebSockets and connection hand-offs alike.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from starlette.middleware.cors import CORSMiddleware
from starlette.types import Receive, Scope, Send

from app_toolkit._runtime.messages import CORSOptions, DeploymentID, RouteInfo

logger = logging.getLogger("app_toolkit.proxy")

#: The paths of the toolkit's own pages (``/-/healthz``, ``/-/metrics``, ...): no
#: application's, whatever its prefix (config/application.py refuses a prefix under it).
OPERATOR_PREFIX = "/-/"


class AppMatcher:
    """One application's prefix, its ingress and its compiled per-route table."""

    __slots__ = ("route_prefix", "app", "ingress", "access_log", "deployments", "cors", "_table")

    def __init__(self, info: RouteInfo) -> None:
        self.route_prefix = info.route_prefix
        self.app = info.app
        self.ingress = info.ingress
        self.access_log = info.access_log  # its requests get access lines
        #: The app's CORS policy, for the preflights the front answers (API keys on).
        self.cors = _cors_policy(info.cors) if info.cors is not None else None
        self._table = [
            (
                re.compile(route.pattern),
                route.methods,
                route.scope_types,
                DeploymentID(info.app, route.deployment) if route.deployment else info.ingress,
                route.deadline_s,
                route.keyless,
            )
            for route in info.routes
        ]
        #: Every deployment requests of this app may go to.
        self.deployments = {info.ingress, *(entry[3] for entry in self._table)}

    def target(
        self, scope_type: str, method: str | None, path: str
    ) -> tuple[DeploymentID, float | None, bool]:
        """The deployment for this request, the route's deadline, if any, and whether it is
        served without an API key (``@open_route``).

        As in Starlette, the first route that matches both path and method wins; a request
        no special route takes goes to the ingress (which answers 404/405 itself).
        """
        if not self._table:
            return self.ingress, None, False
        below = path if self.route_prefix == "/" else path[len(self.route_prefix) :]
        for regex, methods, scope_types, deployment, deadline_s, keyless in self._table:
            if scope_type not in scope_types or (methods is not None and method not in methods):
                continue
            if regex.match(below):
                return deployment, deadline_s, keyless
        return self.ingress, None, False


def _cors_policy(options: CORSOptions) -> CORSMiddleware | None:
    """The app's ``CORSMiddleware``, made again from its keyword arguments (None if they
    do not make one: then the app itself fails on its first request)."""
    kwargs: dict[str, Any] = dict(options)
    try:
        return CORSMiddleware(_no_app, **kwargs)
    except (TypeError, ValueError) as exc:
        logger.warning(
            "The app's CORSMiddleware options do not make one (%s): its preflights need a key", exc
        )
        return None


async def _no_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("the front uses a CORS policy only to answer preflights")


def match_app(apps: list[AppMatcher], path: str) -> AppMatcher | None:
    """Longest prefix wins (``apps`` is sorted longest first); a prefix matches itself
    and paths below it. A path under :data:`OPERATOR_PREFIX` matches no app."""
    if path.startswith(OPERATOR_PREFIX):
        return None
    for app in apps:
        prefix = app.route_prefix
        if prefix == "/" or path == prefix or path.startswith(prefix + "/"):
            return app
    return None


def route_path(scope: Scope) -> str:
    """The path routes are matched on: without the server's ``root_path`` (set by
    ``--root-path`` behind a reverse proxy that strips it), which uvicorn puts in front."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :] or "/"
    return path
