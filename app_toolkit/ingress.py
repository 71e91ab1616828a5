"""HTTP ingress: ``App`` (routers → an application) and ``@ingress`` (Ray Serve style)."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from app_toolkit._runtime import request_context
from app_toolkit._runtime.replica.ingress_app import (
    ASGI_APP_ATTR,
    ASGI_BUILDER_ATTR,
    BUILD_ASGI_METHOD,
    OFFLINE_DOCS_ATTR,
)
from app_toolkit.config import parse_application_options
from app_toolkit.dependencies import discover
from app_toolkit.deployment import Application, Deployment, deployment
from app_toolkit.exceptions import ConfigError

if TYPE_CHECKING:  # FastAPI is imported where an app is built, not by every toolkit process
    from fastapi import APIRouter, FastAPI
    from fastapi.routing import APIRoute, APIWebSocketRoute
    from starlette.routing import BaseRoute
    from starlette.types import ASGIApp


def ingress(
    app: ASGIApp | APIRouter | Callable[[], ASGIApp] | None = None, *, offline_docs: bool = True
) -> Callable[..., type]:
    """Serve ``app`` (a FastAPI app, APIRouter or any ASGI app) from a deployment class.

    Routes declared on the class's own methods (``@app.get("/")`` above ``def root(self)``,
    and WebSocket routes: ``@app.websocket("/ws")`` above ``async def ws(self, websocket)``)
    receive the replica's instance as ``self``. Place it under ``@deployment``.

    The class serves a copy of a FastAPI ``app`` with its own routes: ``app`` itself is
    left as it is, so one app may serve several classes (each gets the routes of its own
    methods and every plain function route, never another class's methods).

    As in Ray Serve, ``app`` may also be a builder function, called with no arguments on
    each replica once its constructor ran; or nothing, when the class defines
    ``__serve_build_asgi_app__(self)`` (sync or async) returning the app. ``ingress(app)()``
    (no class) makes a class whose constructor takes any arguments.

    A FastAPI app's ``/docs`` and ``/redoc`` pages get their files from the app itself
    (``{docs_url}/assets/``), so they work offline; ``offline_docs=False`` keeps FastAPI's
    pages, which load Swagger UI and ReDoc from a CDN.
    """
    builder: Callable[[], ASGIApp] | str | None
    if app is None:
        asgi, builder = None, BUILD_ASGI_METHOD
    elif inspect.isfunction(app):
        asgi, builder = None, app
    else:
        asgi, builder = _as_asgi(app, title="app_toolkit"), None

    def decorate(cls: type | None = None) -> type:
        from fastapi import FastAPI

        from app_toolkit.route_table import route_table

        if cls is None:
            cls = type("ASGIIngress", (), {"__init__": _keep_arguments})
        if isinstance(cls, Deployment):
            raise ConfigError("Put @ingress(app) below @deployment, directly on the class")
        if not inspect.isclass(cls):
            raise ConfigError(f"@ingress decorates a class, got {type(cls).__name__}")
        if callable(getattr(cls, "__call__", None)) and "__call__" in _own_attributes(cls):  # noqa: B004
            raise ConfigError(f"{cls.__name__} is an @ingress class: it may not define __call__")
        if builder == BUILD_ASGI_METHOD and not hasattr(cls, BUILD_ASGI_METHOD):
            raise ConfigError(
                f"@ingress() without an app needs {cls.__name__} to define "
                f"{BUILD_ASGI_METHOD}(self) returning the ASGI app"
            )
        setattr(cls, OFFLINE_DOCS_ATTR, offline_docs)
        if builder is not None:
            setattr(cls, ASGI_BUILDER_ATTR, builder)
        else:
            served = _class_app(asgi, cls) if isinstance(asgi, FastAPI) else asgi
            # As App does: conflicting pool options fail here. FastAPI also analyses the
            # endpoints of included routers now (it would on the first request), so a copy
            # sent to the replicas carries what it found, as the driver resolved it (the
            # names an endpoint's annotations use may not travel with a copy of it).
            route_table(served)
            setattr(cls, ASGI_APP_ATTR, served)
        return cls

    return decorate


def _own_attributes(cls: type) -> set[str]:
    """Names defined by ``cls`` or its bases, ``object`` left out."""
    return {name for base in cls.__mro__ if base is not object for name in vars(base)}


def _keep_arguments(self: Any, *args: object, **kwargs: object) -> None:
    self.args, self.kwargs = args, kwargs


class App(Application):
    """An application whose ingress serves ordinary FastAPI routes.

    ``App(router, name="demo")`` mounts one ``APIRouter`` (or several, or a whole
    ``FastAPI`` app) in an ingress deployment; deployment options (``num_replicas=2``,
    ``max_ongoing_requests=...``) apply to that ingress. ``offline_docs=False`` keeps
    FastAPI's ``/docs`` pages, which load their files from a CDN (see :func:`ingress`).
    """

    def __init__(
        self,
        routes: FastAPI | APIRouter | Sequence[APIRouter],
        *,
        name: str = "default",
        route_prefix: str | None = "/",
        offline_docs: bool = True,
        **deployment_options: object,
    ) -> None:
        from app_toolkit.route_table import route_table

        parse_application_options(name, route_prefix)
        asgi = _as_asgi(routes, title=name)
        route_table(asgi)  # conflicting pool options fail here, not at run()
        ingress_class = type(
            "Ingress", (), {"__doc__": f"HTTP ingress of {name!r}.", "__init__": _keep_handles}
        )
        setattr(ingress_class, ASGI_APP_ATTR, asgi)
        setattr(ingress_class, OFFLINE_DOCS_ATTR, offline_docs)
        # Deployments named by tk.Depends() in the routes join the application; the ingress
        # receives their handles, which keeps them in the graph that run() deploys.
        super().__init__(
            deployment(name="Ingress", **deployment_options)(ingress_class),
            tuple(discover(asgi)),
            {},
            name=name,
            route_prefix=route_prefix,
        )

    @property
    def asgi_app(self) -> FastAPI:
        """The FastAPI app the ingress serves (e.g. to add middleware, before running, to
        the app ``App`` made of your routers). An app of an importable module is imported
        by Ray replicas as its module makes it: change that one in its module
        (docs/deploy.md, "How an app reaches its replicas")."""
        from fastapi import FastAPI

        app = getattr(self.deployment.func_or_class, ASGI_APP_ATTR)
        assert isinstance(app, FastAPI)  # App builds one from its routes
        return app


def _keep_handles(self: Any, *handles: object) -> None:
    self.handles = handles


def _as_asgi(routes: object, title: str) -> ASGIApp:
    from fastapi import APIRouter, FastAPI

    if isinstance(routes, APIRouter):
        routes = [routes]
    if isinstance(routes, (list, tuple)):
        if not routes or not all(isinstance(r, APIRouter) for r in routes):
            raise ConfigError("Pass a FastAPI app, an APIRouter or a list of APIRouters")
        app = FastAPI(title=title)
        for router in routes:
            app.include_router(router)
        return app
    if not callable(routes):
        raise ConfigError(
            f"Expected a FastAPI app, an APIRouter or an ASGI callable, got {type(routes).__name__}"
        )
    return cast("ASGIApp", routes)


async def _current_instance() -> object:
    instance = request_context.replica_instance.get()
    if instance is None:
        raise RuntimeError("This route is a method of an @ingress class; it runs only in a replica")
    return instance


def _class_app(app: FastAPI, cls: type) -> FastAPI:
    """A copy of ``app`` for ``cls``, with a router of its own: routes of ``cls``'s
    methods get the replica's instance as ``self``, routes of other classes' methods are
    left out, the rest are shared. The docs routes are made again, so ``/docs`` and
    ``/openapi.json`` describe this copy. Nothing of ``app`` changes."""
    from fastapi.routing import APIRoute, APIWebSocketRoute
    from starlette.routing import Route

    from app_toolkit._runtime.replica.app_copy import own_copy  # imports Starlette

    own = own_copy(app)
    docs = {app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url} - {None}
    routes: list[BaseRoute] = []
    for route in app.router.routes:
        if not isinstance(route, APIRoute | APIWebSocketRoute):
            if not (isinstance(route, Route) and route.path in docs):  # FastAPI's own docs pages
                routes.append(route)
            continue
        endpoint = route.endpoint
        if cls.__dict__.get(getattr(endpoint, "__name__", "")) is endpoint:
            routes.append(copy_route(route, _self_injected(endpoint)))
        elif not _is_method(endpoint):
            routes.append(route)
    own.router.routes = routes
    own.openapi_schema = None
    own.setup()
    return own


def _is_method(endpoint: Callable[..., object]) -> bool:
    """Whether ``endpoint`` was defined in a class body (its qualified name says so:
    ``Class.method``, not ``function.<locals>.name``)."""
    owner, _, _ = getattr(endpoint, "__qualname__", "").rpartition(".")
    return bool(owner) and not owner.endswith("<locals>")


def _self_injected(method: Callable[..., object]) -> Callable[..., object]:
    from fastapi import Depends

    hints = typing.get_type_hints(method, include_extras=True)
    signature = inspect.signature(method)
    parameters = []
    for position, parameter in enumerate(signature.parameters.values()):
        annotation = hints.get(parameter.name, parameter.annotation)
        if position == 0:
            parameter = parameter.replace(default=Depends(_current_instance), annotation=Any)
        else:
            parameter = parameter.replace(annotation=annotation)
        parameters.append(parameter.replace(kind=inspect.Parameter.KEYWORD_ONLY))
    returns = hints.get("return", signature.return_annotation)

    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def endpoint(**kwargs: object) -> object:
            return await method(**kwargs)

    else:

        @functools.wraps(method)
        def endpoint(**kwargs: object) -> object:
            return method(**kwargs)

    endpoint.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=parameters, return_annotation=returns
    )
    return endpoint


def copy_route(
    route: APIRoute | APIWebSocketRoute, endpoint: Callable[..., object]
) -> APIRoute | APIWebSocketRoute:
    """The same FastAPI HTTP or WebSocket route (path, name, dependencies, response class,
    every setting it was made with) with another endpoint."""
    kind = type(route)
    accepted = inspect.signature(kind.__init__).parameters
    settings = {
        name: getattr(route, name)
        for name in accepted
        if name not in ("self", "path", "endpoint") and hasattr(route, name)
    }
    return kind(route.path, endpoint, **settings)
