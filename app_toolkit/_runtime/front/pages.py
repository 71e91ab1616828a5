"""The toolkit's own pages, served by the front itself for a request no application's
route matches: ``/-/metrics`` and ``/-/dashboard`` (also while the routes load),
``/-/healthz``, ``/-/routes``; a path no application serves is 404 (in Ray Serve's words,
``Path '/x' not found``), and any path 503 until the front has its routes."""

from __future__ import annotations

from typing import Protocol

from app_toolkit._runtime import request_context
from app_toolkit._runtime.answers import error_answer, json_answer, no_route, unavailable
from app_toolkit._runtime.front.cycle import HTTPCycle
from app_toolkit._runtime.front.dashboard import PREFIX as DASHBOARD
from app_toolkit._runtime.front.dashboard import Dashboard
from app_toolkit._runtime.front.metrics_page import CONTENT_TYPE, Gather, render
from app_toolkit._runtime.front.path_match import OPERATOR_PREFIX, AppMatcher
from app_toolkit._runtime.messages import HTTPResponse
from app_toolkit.config import HTTPOptions
from app_toolkit.config.allow_ips import allowed, parse_networks

_BUILTINS = ("/-/healthz", "/-/routes", "/-/metrics")


class Front(Protocol):
    """What the pages read of their front (``http_front.HTTPFront``)."""

    http: HTTPOptions
    dashboard: Dashboard
    apps: list[AppMatcher]
    loaded: bool
    leaving: bool


class ToolkitPages:
    """The pages of one front (a request's ``Responder`` when no app's route matched)."""

    def __init__(self, front: Front, gather: Gather) -> None:
        self._front = front
        self._gather = gather
        self._metrics_readers = parse_networks(front.http.metrics_allow_ips)

    async def http(self, cycle: HTTPCycle) -> None:
        front, request_id, scope, path = self._front, cycle.request_id, cycle.scope, cycle.path
        with request_context.request_scope(request_id):  # for this request's log records
            if path == "/-/metrics":  # served before the routes are loaded, too
                cycle.served_page(path)
                await self._metrics(cycle)
            elif path == DASHBOARD or path.startswith(DASHBOARD + "/"):  # also while the routes load
                status = await front.dashboard.serve(
                    path, scope, cycle.app_receive, cycle.send_other, request_id
                )
                cycle.served_page(DASHBOARD, status)
            elif not front.loaded:
                await cycle.answer(unavailable("the proxy has not loaded its routes yet", request_id))
            elif path.startswith(OPERATOR_PREFIX):
                cycle.served_page(path if path in _BUILTINS else "")
                await self._builtin(path, cycle)
            else:
                await cycle.answer(no_route(path, request_id))

    async def _builtin(self, path: str, cycle: HTTPCycle) -> None:
        front, request_id = self._front, cycle.request_id
        if path == "/-/healthz":
            if front.leaving:
                body = {"status": "draining", "detail": "This node is being drained."}
                await cycle.answer(json_answer(503, body, request_id))
            else:
                await cycle.answer(json_answer(200, {"status": "ok"}, request_id))
        elif path == "/-/routes":
            await cycle.answer(json_answer(200, {r.route_prefix: r.app for r in front.apps}, request_id))
        else:
            await cycle.answer(no_route(path, request_id))

    async def _metrics(self, cycle: HTTPCycle) -> None:
        client = cycle.scope.get("client")
        if not allowed(self._metrics_readers, client[0] if client else None):
            detail = "Forbidden: this address may not read metrics (see metrics_allow_ips)"
            await cycle.answer(error_answer(403, detail, cycle.request_id))
            return
        body = render(await self._gather())
        headers = [(b"content-type", CONTENT_TYPE.encode()), (b"x-request-id", cycle.request_id.encode())]
        await cycle.answer(HTTPResponse(200, headers, body))
