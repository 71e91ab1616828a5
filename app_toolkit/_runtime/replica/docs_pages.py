"""FastAPI's ``/docs`` and ``/redoc`` pages, with their scripts and styles served by the
app itself instead of a CDN, so they render on machines and clusters with no internet.

The files come from the ``fastapi-offline`` package (Swagger UI and ReDoc bundles); the
pages are FastAPI's own (``get_swagger_ui_html``/``get_redoc_html``), pointed at them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import Match, Route
from starlette.types import Scope

_Page = Callable[[Request], Awaitable[Response]]

_TYPES = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
_CACHE = "public, max-age=86400"  # the files change only with the installed package


def serve_docs_offline(app: object) -> None:
    """Swap ``app``'s Swagger UI and ReDoc pages for ones whose files ``app`` serves at
    ``{docs_url}/assets/…``; other apps, and apps without those pages, stay as they are."""
    if not isinstance(app, FastAPI) or not app.openapi_url:
        return
    pages = {app.docs_url: _swagger_page(app), app.redoc_url: _redoc_page(app)}
    pages.pop(None, None)
    if not pages:
        return
    replaced = [
        Route(route.path, pages[route.path], include_in_schema=False)
        if isinstance(route, Route) and route.path in pages
        else route
        for route in app.router.routes
    ]
    # Ahead of the app's own routes, so a catch-all route of the app cannot hide them.
    app.router.routes = [_AssetRoute(_assets_url(app)), *replaced]


class _AssetRoute(Route):
    """The files' route. It is tried first for every request the app gets, so it turns
    away one whose path does not contain its URL with a substring test, before any of
    Starlette's matching work."""

    def __init__(self, url: str) -> None:
        super().__init__(f"{url}/{{name}}", _asset, include_in_schema=False)
        self._marker = url + "/"

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if self._marker not in scope.get("path", ""):
            return Match.NONE, {}
        return super().matches(scope)


def _assets_url(app: FastAPI) -> str:
    return (app.docs_url or app.redoc_url or "").rstrip("/") + "/assets"


def _swagger_page(app: FastAPI) -> _Page:
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        assets = root + _assets_url(app)
        redirect = app.swagger_ui_oauth2_redirect_url
        return get_swagger_ui_html(
            openapi_url=root + str(app.openapi_url),
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=root + redirect if redirect else None,
            init_oauth=app.swagger_ui_init_oauth,
            swagger_ui_parameters=app.swagger_ui_parameters,
            swagger_js_url=f"{assets}/swagger-ui-bundle.js",
            swagger_css_url=f"{assets}/swagger-ui.css",
            swagger_favicon_url=f"{assets}/favicon.png",
        )

    return swagger_ui


def _redoc_page(app: FastAPI) -> _Page:
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        assets = root + _assets_url(app)
        return get_redoc_html(
            openapi_url=root + str(app.openapi_url),
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{assets}/redoc.standalone.js",
            redoc_favicon_url=f"{assets}/favicon.png",
            with_google_fonts=False,  # fonts from Google would need the internet too
        )

    return redoc


async def _asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in _TYPES:
        return Response("Not Found", status_code=404, media_type="text/plain")
    path = resources.files("fastapi_offline").joinpath("static", name)
    return FileResponse(str(path), media_type=_TYPES[name], headers={"Cache-Control": _CACHE})
