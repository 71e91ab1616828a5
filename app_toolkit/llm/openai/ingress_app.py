"""The ingress of one OpenAI application: the class ``build_openai_app`` deploys and the
FastAPI app it serves.

The app holds the OpenAI endpoints (``ingress.routes``) on :class:`OpenAIIngress`, or on the
subclass ``ingress_cls_config`` names (Ray Serve LLM's field): a method the subclass
overrides is what its route calls, and the subclass adds routes of its own (``extra_routes``)
and middleware (``middleware``). Its middleware, outermost first: CORS with vLLM's options
(``allowed_origins`` and the rest), the API key check of ``LLMServingArgs.api_key``
(``ingress.KeyGuard``, with keys only), then the subclass's. Each application gets an app
and a class of its own (known to deploys by its base's name and these options), so two
OpenAI applications in one process may differ.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute, APIWebSocketRoute
from starlette.middleware.cors import CORSMiddleware

import app_toolkit as tk
from app_toolkit.code_sources import CODE_NAME_ATTR, code_name
from app_toolkit.exceptions import ConfigError
from app_toolkit.ingress import copy_route
from app_toolkit.llm import errors
from app_toolkit.llm.openai.ingress import KeyGuard, OpenAIIngress, routes
from app_toolkit.llm.serving_args import LLMServingArgs

_Route = APIRoute | APIWebSocketRoute


def ingress_class(base: object, args: LLMServingArgs, keyed: bool) -> type[OpenAIIngress]:
    """A class of its own for one OpenAI application: ``base`` (OpenAIIngress or a subclass)
    serving an app of its endpoints, its ``extra_routes`` and ``middleware``, the key check
    (``keyed``: the app has keys) and CORS by ``args``' vLLM options."""
    if not (isinstance(base, type) and issubclass(base, OpenAIIngress)):
        raise ConfigError(
            "ingress_cls_config.ingress_cls must be a subclass of app_toolkit.llm.OpenAIIngress, "
            f"got {base!r}"
        )
    app = FastAPI(title="OpenAI-compatible API", summary="app_toolkit.llm")
    errors.install(app)
    methods: dict[str, Callable[..., object]] = {}
    for route in (*routes.routes, *_extra_routes(base)):
        assert isinstance(route, _Route)  # (the OpenAI routes are; extra_routes checked)
        name = getattr(route.endpoint, "__name__", "")
        if not _a_method_of(base, route.endpoint):
            app.router.routes.append(route)  # a plain function's route, served as it is
            continue
        method = _method(base, name, route)
        app.router.routes.append(route if method is route.endpoint else copy_route(route, method))
        methods[method.__name__] = method
    for entry in reversed(tuple(base.middleware)):  # the first listed ends outermost of them
        app.add_middleware(entry.cls, *entry.args, **entry.kwargs)
    if keyed:
        app.add_middleware(KeyGuard)
    cors = {
        "allow_origins": list(args.allowed_origins),
        "allow_methods": list(args.allowed_methods),
        "allow_headers": list(args.allowed_headers),
        "allow_credentials": args.allow_credentials,
    }
    app.add_middleware(CORSMiddleware, **cors)  # type: ignore[arg-type]  # (its keywords)
    # Its own class: @ingress binds the routes of the methods in the class's own namespace.
    served = type(base.__name__, (base,), {"__module__": base.__module__, "__doc__": base.__doc__, **methods})
    # Known to deploys by its base's name and what the app adds (a redeploy of the same
    # options keeps the replicas; the base's source files are in its version already).
    named = code_name(base)
    if named is not None:  # (a class made in a function has no name to know it by)
        setattr(served, CODE_NAME_ATTR, f"{named}+{json.dumps([cors, keyed], sort_keys=True)}")
    return tk.ingress(app)(served)


def _extra_routes(base: type[OpenAIIngress]) -> list[_Route]:
    extra = base.extra_routes
    if extra is None:
        return []
    if not isinstance(extra, APIRouter):
        raise ConfigError(
            f"{base.__name__}.extra_routes must be a FastAPI APIRouter, got {type(extra).__name__}"
        )
    odd = [route for route in extra.routes if not isinstance(route, _Route)]
    if odd:
        raise ConfigError(
            f"{base.__name__}.extra_routes may hold only routes made by the router's own decorators "
            f"(get, post, websocket...), not {type(odd[0]).__name__}: add an included router's routes "
            "to it directly"
        )
    return [route for route in extra.routes if isinstance(route, _Route)]


def _method(base: type[OpenAIIngress], name: str, route: _Route) -> Callable[..., object]:
    """What ``route`` calls on ``base``: the method named as its endpoint, as ``base``
    has it (an override of the endpoint's method, or the method itself)."""
    method = getattr(base, name, None)
    if not inspect.isfunction(method):
        raise ConfigError(
            f"{base.__name__}.{name} serves {route.path}: it must be a method (def), not {method!r}"
        )
    if method is not route.endpoint:
        kinds = {parameter.kind for parameter in inspect.signature(method).parameters.values()}
        if kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}:
            raise ConfigError(
                f"{base.__name__}.{name} overrides the method of {route.path}: it must name its "
                "parameters as that method does (FastAPI reads them), not take *args or **kwargs"
            )
    return method


def _a_method_of(cls: type, endpoint: Callable[..., object]) -> bool:
    """``endpoint`` is defined in the body of ``cls`` or one of its bases."""
    name = getattr(endpoint, "__name__", "")
    return any(vars(owner).get(name) is endpoint for owner in cls.__mro__)
