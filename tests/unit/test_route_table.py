"""Reading an app's routes: pools, the proxy's table, clashes; and matching requests."""

from __future__ import annotations

import pytest
from fastapi import APIRouter, FastAPI, WebSocket

import app_toolkit as tk
from app_toolkit._runtime.controller.prefixes import check_prefixes
from app_toolkit._runtime.front.path_match import AppMatcher
from app_toolkit._runtime.messages import AppSpec, DeploymentID, RouteInfo
from app_toolkit.route_table import route_table


def make_app() -> FastAPI:
    inner = APIRouter(prefix="/v1")

    @inner.get("/fixed")
    async def fixed() -> None: ...

    @inner.get("/things/{thing_id:int}")
    @tk.replicated(num_replicas=3)
    async def thing(thing_id: int) -> None: ...

    @inner.websocket("/live")
    @tk.replicated(name="thing", num_replicas=3)
    async def live(websocket: WebSocket) -> None: ...

    @inner.get("/late")
    async def late() -> None: ...

    app = FastAPI()

    @app.get("/slow")
    @tk.deadline(2.5)
    async def slow() -> None: ...

    app.include_router(inner, prefix="/api")
    return app


def test_pools_and_the_table_follow_fastapi_order_with_prefixes() -> None:
    table = route_table(make_app())
    assert table.pools == {"thing": {"num_replicas": 3}}
    special = [(r.deployment, r.deadline_s) for r in table.routes if r.deployment or r.deadline_s]
    assert special == [(None, 2.5), ("thing", None), ("thing", None)]
    assert "/api/v1/late" in table.paths
    assert not any("late" in r.pattern for r in table.routes)  # after the last special route


def test_an_app_without_special_routes_needs_no_table() -> None:
    router = APIRouter()

    @router.get("/a/{x}")
    async def a(x: str) -> None: ...

    table = route_table(FastAPI(routes=router.routes))
    assert table.routes == () and table.pools == {} and "/a/{x}" in table.paths


def test_requests_reach_the_route_fastapi_would_pick() -> None:
    table = route_table(make_app())
    app = AppMatcher(RouteInfo("/shop", "shop", DeploymentID("shop", "Ingress"), table.routes))
    pool = DeploymentID("shop", "thing")
    assert app.target("http", "GET", "/shop/api/v1/things/12") == (pool, None, False)
    assert app.target("http", "GET", "/shop/api/v1/things/twelve")[0] == app.ingress  # int only
    assert app.target("http", "POST", "/shop/api/v1/things/12")[0] == app.ingress  # 405 there
    assert app.target("websocket", None, "/shop/api/v1/live") == (pool, None, False)
    assert app.target("http", "GET", "/shop/api/v1/live")[0] == app.ingress
    assert app.target("http", "GET", "/shop/slow") == (app.ingress, 2.5, False)
    assert app.target("http", "GET", "/shop") == (app.ingress, None, False)
    assert app.deployments == {app.ingress, pool}


def test_hidden_routes_are_named_and_conflicting_pool_options_are_config_errors() -> None:
    router = APIRouter()

    @router.websocket("/ws/{a}")
    async def one(websocket: WebSocket) -> None: ...

    @router.websocket("/ws/{b}")
    async def two(websocket: WebSocket) -> None: ...

    @router.get("/ws/{c:int}")  # another converter: another shape
    async def three() -> None: ...

    assert route_table(FastAPI(routes=router.routes)).hidden == (
        f"WEBSOCKET /ws/{{b}} ({__name__}.{two.__qualname__}) never runs: "
        f"{__name__}.{one.__qualname__} answers WEBSOCKET /ws/{{a}} first",
    )

    other = APIRouter()

    @other.get("/x")
    @tk.replicated(name="p", num_replicas=1)
    async def x() -> None: ...

    @other.get("/y")
    @tk.replicated(name="p", num_replicas=2)
    async def y() -> None: ...

    with pytest.raises(tk.ConfigError, match="pool 'p' with different options"):
        route_table(FastAPI(routes=other.routes))


def test_decorator_arguments_fail_fast() -> None:
    with pytest.raises(tk.ConfigError, match="num_replicas"):
        tk.replicated(num_replicas=-1)
    with pytest.raises(tk.ConfigError, match="letters, digits"):
        tk.replicated(name="a b")
    with pytest.raises(tk.ConfigError, match="@deadline"):
        tk.deadline(0)


def test_an_app_may_not_hide_another_apps_routes() -> None:
    def spec(name: str, prefix: str, *paths: str) -> AppSpec:
        return AppSpec(name, prefix, "Ingress", (), (), paths)

    root = spec("root", "/", "/api/users/{user_id}", "/health")
    check_prefixes(spec("elsewhere", "/other"), root)
    check_prefixes(spec("partial", "/ap"), root)  # "/ap" is not a path segment of "/api"
    with pytest.raises(tk.ConfigError, match="Route /api/users/{user_id} of application 'root'"):
        check_prefixes(spec("api", "/api/users"), root)
    with pytest.raises(tk.ConfigError, match="of application 'new' would be hidden"):
        check_prefixes(spec("new", "/", "/deep/x"), spec("deep", "/deep"))
    with pytest.raises(tk.ConfigError, match="already used"):
        check_prefixes(spec("twin", "/"), root)


def test_every_pool_is_deployed_with_its_app_on_every_build() -> None:
    """Pools are temporary bound nodes while the app is built; a freed node's id used to
    come back for the next pool, which then looked built and was left out (flaky 503
    "Deployment .../boomer does not exist")."""
    from app_toolkit.build import build_app
    from tests.apps import pools

    for _ in range(500):
        spec = build_app(pools.make_app(), "p", "/p", lambda value: b"x")
        deployed = {d.id.name for d in spec.deployments}
        assert {route.deployment for route in spec.routes if route.deployment} <= deployed
