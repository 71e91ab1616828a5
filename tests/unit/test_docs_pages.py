"""The offline docs' files route: tried before the app's own routes, it takes only paths
under its URL (also under a root path), and a catch-all route of the app cannot hide it."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.routing import Match

from app_toolkit._runtime.replica.docs_pages import serve_docs_offline


def _scope(path: str, root_path: str = "") -> dict[str, object]:
    return {"type": "http", "method": "GET", "path": root_path + path, "root_path": root_path}


def test_the_files_route_takes_only_paths_under_its_url() -> None:
    app = FastAPI()

    @app.get("/{anything:path}")
    async def catch_all(anything: str) -> str:
        return anything

    serve_docs_offline(app)
    files = app.router.routes[0]
    for root in ("", "/api/v1"):
        match, child = files.matches(_scope("/docs/assets/swagger-ui.css", root))
        assert match is Match.FULL and child["path_params"] == {"name": "swagger-ui.css"}
        assert files.matches(_scope("/small", root))[0] is Match.NONE
        assert files.matches(_scope("/docs", root))[0] is Match.NONE
    # The catch-all comes after it: the files win.
    assert [getattr(route, "path", "") for route in app.router.routes][0] == "/docs/assets/{name}"


def test_every_file_the_pages_serve_is_in_fastapi_offlines_static_folder() -> None:
    """The internal fastapi-offline's cap in pyproject.toml stands for (docs/compatibility.md):
    the file names under its static/ folder."""
    from importlib import resources

    from app_toolkit._runtime.replica.docs_pages import _TYPES

    folder = resources.files("fastapi_offline").joinpath("static")
    missing = [name for name in _TYPES if not folder.joinpath(name).is_file()]
    assert missing == [], missing
