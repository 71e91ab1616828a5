"""``Depends(Deployment)``: a route parameter that receives a handle to a deployment.

``App(router)`` finds these dependencies in its routes and deploys the deployments they
name as part of the application, so routes in an ordinary ``APIRouter`` can use them::

    @router.post("/embed")
    async def embed(text: str, embedder: tk.DeploymentHandle = tk.Depends(Embedder)):
        return {"vector": await embedder.embed.remote(text)}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from app_toolkit._runtime import fastapi_compat, request_context
from app_toolkit.deployment import Application, Deployment
from app_toolkit.exceptions import ConfigError
from app_toolkit.handle import DeploymentHandle

if TYPE_CHECKING:  # FastAPI is imported where an app is built, not by every toolkit process
    from fastapi.routing import APIRoute, APIWebSocketRoute

_APPLICATION_ATTR = "__app_toolkit_application__"


def Depends(target: Deployment | Application) -> Any:
    """A FastAPI dependency that yields a :class:`DeploymentHandle` to ``target``.

    Pass a deployment (bound with no arguments) or a bound application
    (``Greeter.bind("Hello")``); bind once at module level and reuse the result.
    """
    if isinstance(target, Deployment):
        application = getattr(target, "_default_application", None)
        if application is None:
            application = target.bind()
            target._default_application = application  # type: ignore[attr-defined]
    elif isinstance(target, Application):
        application = target
    else:
        raise ConfigError(
            f"tk.Depends() takes a deployment or a bound deployment, got {type(target).__name__}; "
            "for ordinary dependencies use fastapi.Depends"
        )
    deployment_name = application.deployment.name

    async def deployment_handle() -> DeploymentHandle:
        app_name = request_context.app_name.get()
        if not app_name:
            raise RuntimeError("tk.Depends() handles are available only inside a replica")
        return DeploymentHandle(deployment_name, app_name)

    setattr(deployment_handle, _APPLICATION_ATTR, application)
    import fastapi

    return fastapi.Depends(deployment_handle)


def discover(app: object) -> list[Application]:
    """The bound deployments that the routes of ``app`` depend on, once each."""
    found: dict[int, Application] = {}

    def walk(dependant: Any) -> None:
        for sub in getattr(dependant, "dependencies", ()):
            application = getattr(sub.call, _APPLICATION_ATTR, None)
            if application is not None:
                found.setdefault(id(application), application)
            walk(sub)

    for route in api_routes(getattr(getattr(app, "router", None), "routes", ())):
        walk(route.dependant)
    return list(found.values())


def api_routes(routes: Iterable[object]) -> list[APIRoute | APIWebSocketRoute]:
    """Every FastAPI route, including those of included routers.

    FastAPI >= 0.137 keeps an included router as one lazy entry that holds the original
    router; older versions copy its routes in (``fastapi_compat.included_router``).
    """
    from fastapi.routing import APIRoute, APIWebSocketRoute

    found: list[APIRoute | APIWebSocketRoute] = []
    for route in routes:
        if isinstance(route, (APIRoute, APIWebSocketRoute)):
            found.append(route)
        inner = fastapi_compat.included_router(route)
        if inner is not None:
            found.extend(api_routes(getattr(inner, "routes", ())))
    return found
