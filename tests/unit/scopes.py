"""ASGI scopes for tests that drive an app or the front in process."""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app_toolkit._runtime.front.cycle import FrontRules, HTTPCycle
from app_toolkit._runtime.front.request_link import REQUEST_LINK
from app_toolkit._runtime.inprocess import MemoryLink
from app_toolkit._runtime.request_keys import SHARD_KEY_HEADER
from app_toolkit.config import HTTPOptions


def http_scope(
    path: str, query: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None
) -> dict[str, Any]:
    """A GET to ``path`` as a server would hand it to its app."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query,
        "headers": list(headers or []),
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 1234),
    }


class ResponseCutOff(Exception):
    """The front cut a started response off (raised to the test's ASGI transport)."""


def _cut_off() -> None:
    raise ResponseCutOff("the front cut the response off after its head")


def memory_link() -> MemoryLink:
    """A request's link as an in-memory server gives it: every wait for the body bounded."""
    return MemoryLink(lambda: False, _cut_off)


def linked(app: ASGIApp) -> ASGIApp:
    """``app`` (the front) as its servers call it: each HTTP request with its link."""

    async def call(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[REQUEST_LINK] = memory_link()
        await app(scope, receive, send)

    return call


def cycle_for(send: Send, method: str = "GET", http: HTTPOptions | None = None) -> HTTPCycle:
    """A request's cycle as the front makes it (in a task), its responses going to ``send``."""

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    scope = {**http_scope("/"), "method": method, REQUEST_LINK: memory_link()}
    rules = FrontRules(http or HTTPOptions(), SHARD_KEY_HEADER, None)
    return HTTPCycle(scope, receive, send, rules, None, "/")
