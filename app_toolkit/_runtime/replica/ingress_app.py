"""The ASGI app an ``@ingress`` class serves in its replica: given with the class, or made
after its constructor by a builder; then the replica's own copy of it, with the toolkit's
error handler and (FastAPI) offline docs pages installed on the copy."""

from __future__ import annotations

from typing import cast

from starlette.types import ASGIApp

from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.replica.user_code import call_maybe_async, install_error_handler

ASGI_APP_ATTR = "__app_toolkit_asgi_app__"
#: On an @ingress class whose app is made on the replica: a builder function, called with
#: no arguments after the constructor, or BUILD_ASGI_METHOD (call that method).
ASGI_BUILDER_ATTR = "__app_toolkit_asgi_builder__"
BUILD_ASGI_METHOD = "__serve_build_asgi_app__"  # Ray Serve's name
#: On an @ingress class: False keeps FastAPI's /docs pages as they are (files from a CDN).
OFFLINE_DOCS_ATTR = "__app_toolkit_offline_docs__"


async def ingress_app(definition: type, instance: object, deployment: DeploymentID) -> ASGIApp | None:
    """The ASGI app ``definition`` (an @ingress class, ``instance`` built) serves: given, or
    made now by its builder; None for a class that is no ingress."""
    builder = getattr(definition, ASGI_BUILDER_ATTR, None)
    if builder == BUILD_ASGI_METHOD:
        app = await call_maybe_async(getattr(instance, BUILD_ASGI_METHOD))
    elif builder is not None:
        app = await call_maybe_async(builder)
    else:
        return getattr(definition, ASGI_APP_ATTR, None)
    if not callable(app):
        raise TypeError(f"The ASGI app builder of {deployment} returned {type(app).__name__}")
    return cast(ASGIApp, app)


def serving_app(app: ASGIApp, definition: type) -> ASGIApp:
    """What the replica serves of ``app``: its own copy (what is added here stays off the
    user's app), with the toolkit's error handler and, unless the class said otherwise,
    FastAPI's docs pages served offline."""
    from app_toolkit._runtime.replica.app_copy import serving_copy  # ASGI ingresses only

    served = serving_copy(app)
    install_error_handler(served)
    if getattr(definition, OFFLINE_DOCS_ATTR, True):
        from app_toolkit._runtime.replica.docs_pages import serve_docs_offline  # FastAPI apps only

        serve_docs_offline(served)
    return served
