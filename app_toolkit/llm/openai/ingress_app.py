"""The ingress of one OpenAI application: the class ``build_openai_app`` deploys and the
FastAPI app it serves.

The app holds the OpenAI endpoints (``ingress.routes``) on :class:`OpenAIIngress`, or on the
subclass ``ingress_cls_config`` names (Ray Serve LLM's field): a method the subclass
overrides is what its route calls, and the subclass adds routes of its own methods
(``extra_routes``) and middleware (``middleware``). Its middleware, outermost first:
CORS with vLLM's options (``allowed_origins`` and the rest), the API key check of
``LLMServingArgs.api_key`` (``ingress.KeyGuard``), then the subclass's. Each application
gets an app and a class of its own, so two OpenAI applications in one process may differ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.middleware.cors import CORSMiddleware

import app_toolkit as tk
from app_toolkit.exceptions import ConfigError
from app_toolkit.llm import errors
from app_toolkit.llm.openai.ingress import KeyGuard, OpenAIIngress, routes
from app_toolkit.llm.serving_args import LLMServingArgs


def ingress_class(base: object, args: LLMServingArgs) -> type[OpenAIIngress]:
    """A class of its own for one OpenAI application: ``base`` (OpenAIIngress or a subclass)
    serving an app of its endpoints, its ``extra_routes`` and ``middleware``, the key check
    and CORS by ``args``' vLLM options."""
    if not (isinstance(base, type) and issubclass(base, OpenAIIngress)):
        raise ConfigError(
            "ingress_cls_config.ingress_cls must be a subclass of app_toolkit.llm.OpenAIIngress, "
            f"got {base!r}"
        )
    app = FastAPI(title="OpenAI-compatible API", summary="app_toolkit.llm")
    errors.install(app)
    methods: dict[str, Callable[..., Any]] = {}
    extra = base.extra_routes
    if extra is not None and not isinstance(extra, APIRouter):
        raise ConfigError(
            f"{base.__name__}.extra_routes must be a FastAPI APIRouter, got {type(extra).__name__}"
        )
    for router in (routes, extra):
        for route in router.routes if router is not None else ():
            if not isinstance(route, APIRoute) or not _a_method_of(base, route.endpoint):
                # Served as it is: a plain function's route (another class's method is left
                # out by @ingress, as it always is).
                app.router.routes.append(route)
                continue
            name = route.endpoint.__name__
            method = getattr(base, name)
            overridden = method is not route.endpoint
            app.add_api_route(
                route.path,
                method,
                methods=sorted(route.methods or ()),
                # An override says what it returns: no response model is assumed for it.
                response_model=None if overridden else route.response_model,
                status_code=route.status_code,
                name=route.name,
                include_in_schema=route.include_in_schema,
            )
            methods[name] = method
    for entry in reversed(tuple(base.middleware)):  # the first listed ends outermost of them
        app.add_middleware(entry.cls, *entry.args, **entry.kwargs)
    app.add_middleware(KeyGuard)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(args.allowed_origins),
        allow_methods=list(args.allowed_methods),
        allow_headers=list(args.allowed_headers),
        allow_credentials=args.allow_credentials,
    )
    # Its own class: @ingress binds the routes of the methods in the class's own namespace.
    served = type(base.__name__, (base,), {"__module__": base.__module__, "__doc__": base.__doc__, **methods})
    return tk.ingress(app)(served)


def _a_method_of(cls: type, endpoint: Callable[..., object]) -> bool:
    """``endpoint`` is defined in the body of ``cls`` or one of its bases."""
    name = getattr(endpoint, "__name__", "")
    return any(vars(owner).get(name) is endpoint for owner in cls.__mro__)
