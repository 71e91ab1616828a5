"""Apps that reach Ray replicas as they were written (tests/behaviour/test_shipping.py).

- ``wsgi_app`` mounts a WSGI app holding a weak reference, as a Flask app does: pickle
  cannot write it, so the app must be imported by the replica, not copied into it.
  ``wsgi_router`` does the same in a router (``tk.App(wsgi_router)`` includes it in an app
  made for it).
- ``make_graph_app()`` makes an app including a router whose endpoints are functions
  defined inside a method, in a module with postponed annotations (this one) whose
  annotation names (``Request``, ``Response``, ``BackgroundTasks``) appear in no code:
  strawberry's ``GraphQLRouter`` is written so. A copy of such a function keeps only the
  names its code reads, and FastAPI, reading the annotations in the replica, would take
  ``request`` for a query parameter.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import APIRouter, BackgroundTasks, FastAPI, Request, Response

with warnings.catch_warnings():  # deprecated in favour of a2wsgi, which is not a dependency
    warnings.simplefilter("ignore")
    from starlette.middleware.wsgi import WSGIMiddleware as WSGIMiddleware  # re-exported: no warning


class _Owner:
    pass


class WeakWSGIApp:
    """A WSGI app holding what pickle cannot write (a weak reference)."""

    def __init__(self) -> None:
        self._owner = _Owner()
        self.owner_ref = weakref.ref(self._owner)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., object]) -> Iterable[bytes]:
        start_response("200 OK", [("content-type", "text/plain")])
        return [f"wsgi {environ['PATH_INFO']}".encode()]


wsgi_app = FastAPI()
wsgi_app.mount("/wsgi", WSGIMiddleware(WeakWSGIApp()))


@wsgi_app.get("/asgi")
async def asgi_route() -> str:
    return "asgi"


wsgi_router = APIRouter()
wsgi_router.mount("/wsgi", WSGIMiddleware(WeakWSGIApp()))
wsgi_router.add_api_route("/asgi", asgi_route)


class LocalEndpointsRouter(APIRouter):
    """A router whose endpoint is made in ``__init__`` (``<locals>``), as strawberry's is."""

    def __init__(self) -> None:
        super().__init__()

        async def handle(
            request: Request, response: Response, background_tasks: BackgroundTasks
        ) -> dict[str, Any]:
            response.headers["x-handled"] = "yes"
            return {"path": request.url.path, "tasks": len(background_tasks.tasks)}

        self.add_api_route("/graphql", handle, methods=["POST"])


def make_graph_app() -> FastAPI:
    """A new app each time: FastAPI analyses an included router's routes once, when first
    asked, and keeps the result in the app (a run on one backend must not do it for the other)."""
    app = FastAPI()
    app.include_router(LocalEndpointsRouter())
    return app
