"""Read an app's routes at build time: pools, deadlines, the proxy's table, hidden routes.

The proxy normally sends every request below an app's ``route_prefix`` to its ingress.
When routes carry ``@replicated``, ``@deadline`` or ``@open_route``, the proxy also needs the app's routes
in FastAPI's own matching order (first full match wins, as in Starlette), so that a
request reaches the route FastAPI would pick. Routes after the last special one never
need matching, so the table stops there.

Two routes with the same method and path shape are served as Starlette serves them (the
first runs); the table names the hidden one, for a warning when the app is deployed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fastapi.routing
from fastapi.routing import APIRouter
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Mount, WebSocketRoute

from app_toolkit._runtime.messages import CORSOptions, PathRoute
from app_toolkit.exceptions import ConfigError
from app_toolkit.routes import route_options

# Newer FastAPI keeps an included router as one lazy entry; this walks those entries with
# their prefixes applied. Older FastAPI copies included routes into the app's own list.
_iter_route_contexts = getattr(fastapi.routing, "iter_route_contexts", None)

_PARAM_RE = re.compile(r"\{[^}:]+(:[^}]+)?\}")


@dataclass(frozen=True)
class RouteTable:
    """What the build needs from one ingress app."""

    pools: dict[str, dict[str, Any]]  # pool deployment name -> its deployment options
    routes: tuple[PathRoute, ...]  # the proxy's table; empty when nothing is special
    paths: tuple[str, ...]  # every route's path template
    hidden: tuple[str, ...] = ()  # one line per route an earlier one hides
    cors: CORSOptions | None = None  # the app's CORSMiddleware's keyword arguments


@dataclass(frozen=True)
class _Route:
    path: str
    pattern: str | None
    methods: frozenset[str] | None
    scope_types: frozenset[str]
    endpoint: object


def route_table(app: object) -> RouteTable:
    """The pools, proxy table and paths of ``app``; ConfigError on conflicting pools."""
    routes = list(_routes(app))
    pools: dict[str, dict[str, Any]] = {}
    table: list[PathRoute] = []
    special = 0
    unmatchable = ""  # a route before this one that the proxy cannot match by path
    for route in routes:
        options = route_options(route.endpoint)
        pool = options.pool if options else None
        deadline_s = options.deadline_s if options else None
        if options is not None and options.pool is not None:
            wanted = dict(options.pool_options)
            if pools.setdefault(options.pool, wanted) != wanted:
                raise ConfigError(
                    f"Two routes use the pool {options.pool!r} with different options; give "
                    "one of them another @replicated(name=...) or the same options"
                )
        if route.pattern is None:
            unmatchable = unmatchable or (route.path or "a Host route")
            continue
        keyless = options.keyless if options else False
        if keyless and unmatchable:
            raise ConfigError(
                f"@open_route {route.path!r} comes after {unmatchable!r}, which the proxy cannot "
                "match by path (it could take requests the proxy lets in without a key): move "
                "the open route before it"
            )
        table.append(PathRoute(route.pattern, route.methods, route.scope_types, pool, deadline_s, keyless))
        if pool is not None or deadline_s is not None or keyless:
            special = len(table)
    if any(route.pattern is None and route_options(route.endpoint) for route in routes):
        raise ConfigError("@replicated/@deadline/@open_route routes need a path the proxy can match")
    paths = tuple(route.path for route in routes if route.path)
    return RouteTable(pools, tuple(table[:special]), paths, _hidden(routes), _cors(app))


def _cors(app: object) -> CORSOptions | None:
    """The keyword arguments of the app's ``CORSMiddleware`` when it is Starlette's own, the
    outermost of the app's middleware (its answer to a preflight is then the app's), and
    given plain values by keyword; else None (with API keys on, a preflight needs a key)."""
    stack = getattr(app, "user_middleware", None)
    if not stack or getattr(stack[0], "cls", None) is not CORSMiddleware or stack[0].args:
        return None
    options: list[tuple[str, object]] = []
    for name, value in sorted(stack[0].kwargs.items()):
        if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(item, str) for item in value):
            value = tuple(sorted(value) if isinstance(value, (set, frozenset)) else value)
        elif value is not None and not isinstance(value, (str, bool, int)):
            return None  # not a value the proxy can hold without the app's code
        options.append((name, value))
    return tuple(options)


def _routes(app: object) -> Iterator[_Route]:
    router = app if isinstance(app, APIRouter) else getattr(app, "router", None)
    routes = getattr(router, "routes", None)
    if not isinstance(routes, list):
        return  # an ASGI app without a Starlette router: the proxy cannot see its routes
    contexts: Any = _iter_route_contexts(routes) if _iter_route_contexts else routes
    for context in contexts:
        original = getattr(context, "original_route", context)
        path = getattr(context, "path", None)
        if not isinstance(path, str):  # a Host route: matched on the host name, not the path
            yield _Route("", None, None, frozenset({"http", "websocket"}), None)
            continue
        regex = getattr(context, "path_regex", None)
        if isinstance(original, Mount):
            kinds = frozenset({"http", "websocket"})
        elif isinstance(original, WebSocketRoute):
            kinds = frozenset({"websocket"})
        else:
            kinds = frozenset({"http"})
        methods = getattr(context, "methods", None)
        yield _Route(
            path,
            regex.pattern if regex is not None else None,
            frozenset(methods) if methods and "http" in kinds and len(kinds) == 1 else None,
            kinds,
            getattr(context, "endpoint", None),
        )


def _hidden(routes: list[_Route]) -> tuple[str, ...]:
    """Routes an earlier route with the same method and path shape hides: Starlette runs
    only the first, and so does the toolkit (one line each, for a warning)."""
    seen: dict[tuple[str, str], _Route] = {}
    lines: list[str] = []
    for route in routes:
        if len(route.scope_types) != 1:
            continue  # mounts share their prefix on purpose
        shape = _PARAM_RE.sub(lambda m: "{" + (m.group(1) or "") + "}", route.path)
        verbs = ["WEBSOCKET"] if "websocket" in route.scope_types else sorted(route.methods or {"*"})
        for verb in verbs:
            first = seen.setdefault((shape, verb), route)
            if first is not route:
                lines.append(
                    f"{verb} {route.path} ({_name(route.endpoint)}) never runs: "
                    f"{_name(first.endpoint)} answers {verb} {first.path} first"
                )
    return tuple(lines)


def _name(endpoint: object) -> str:
    module = getattr(endpoint, "__module__", None)
    name = getattr(endpoint, "__qualname__", None) or repr(endpoint)
    return f"{module}.{name}" if module else name
