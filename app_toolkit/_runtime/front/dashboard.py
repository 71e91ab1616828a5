"""``/-/dashboard``: a live status page on the proxy's port.

The page and its script and style are files of this package (no CDN, no build step).
``/-/dashboard/events`` is a server-sent event stream with the page's state every
second: one sampler per proxy feeds every open page, and runs only while one is open.

Who may see it: clients in ``HTTPOptions.dashboard_allow_ips`` (loopback by default),
and, when ``dashboard_token`` is set, anyone presenting it (``?token=`` once, which sets
a cookie for the page's own requests, or ``Authorization: Bearer``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from http.cookies import CookieError, SimpleCookie
from importlib import resources
from urllib.parse import parse_qs

from starlette.types import Receive, Scope, Send

from app_toolkit._runtime.answers import error_answer, send_answer, unavailable
from app_toolkit._runtime.front.dashboard_view import RouteRates, view
from app_toolkit._runtime.front.metrics_page import Gather
from app_toolkit._runtime.messages import HTTPResponse
from app_toolkit.config import HTTPOptions
from app_toolkit.config.allow_ips import Networks, allowed, parse_networks
from app_toolkit.metrics import snapshot
from app_toolkit.status import ServeStatus

logger = logging.getLogger("app_toolkit.proxy")

#: The controller's status, as the backend reads it.
StatusSource = Callable[[], Awaitable[ServeStatus]]

PREFIX = "/-/dashboard"
_FILES = {
    PREFIX: ("index.html", "text/html; charset=utf-8"),
    PREFIX + "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    PREFIX + "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
_COOKIE = "app_toolkit_dashboard"
_SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        b"img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),  # the token may be in the page's URL
    (b"cache-control", b"no-store"),
]

#: How often open pages get a new state, and how long one stream lasts (the browser
#: reconnects by itself; a bound keeps a forgotten tab from holding a stream for ever).
PERIOD_S = 1.0
STREAM_LIFETIME_S = 600.0
#: Open pages at once; more are answered 503.
MAX_VIEWERS = 8
_STATUS_TIMEOUT_S = 2.0


class Dashboard:
    """Serves the page and its event stream for one proxy."""

    def __init__(self, http: HTTPOptions, status: StatusSource | None, gather: Gather) -> None:
        self._viewers_allowed: Networks = parse_networks(http.dashboard_allow_ips)
        self._token = http.dashboard_token or ""
        self._cookie_path = http.root_path + PREFIX  # as the browser sees it
        self._status = status
        self._gather = gather
        self._rates = RouteRates()
        self._feeds: set[asyncio.Queue[bytes]] = set()
        self._sampler: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()

    def close(self) -> None:
        """End every open stream (the proxy is stopping)."""
        self._closed.set()

    async def serve(self, path: str, scope: Scope, receive: Receive, send: Send, request_id: str) -> int:
        """Answer one request under ``/-/dashboard``; returns its status."""
        token_given = self._token_given(scope)
        if not self._may_view(scope, token_given):
            detail = "Forbidden: the dashboard answers local clients (see dashboard_allow_ips) or a token"
            return await send_answer(send, error_answer(403, detail, request_id))
        if path == PREFIX + "/events":
            return await self._stream(receive, send, request_id)
        if path == PREFIX + "/":  # the page's own links are relative to /-/dashboard
            query = scope.get("query_string", b"")
            location = b"../dashboard" + (b"?" + query if query else b"")
            headers = [
                (b"location", location),
                (b"x-request-id", request_id.encode()),
                (b"content-length", b"0"),
            ]
            return await send_answer(send, HTTPResponse(307, headers, b""))
        found = _FILES.get(path)
        if found is None:
            return await send_answer(send, error_answer(404, "Not Found", request_id))
        name, content_type = found
        body = resources.files(__package__).joinpath("dashboard_files", name).read_bytes()
        headers = [
            (b"content-type", content_type.encode()),
            (b"x-request-id", request_id.encode()),
            *_SECURITY_HEADERS,
        ]
        if token_given and path == PREFIX and _query_token(scope):
            cookie = f"{_COOKIE}={self._token}; Path={self._cookie_path}; HttpOnly; SameSite=Strict"
            if scope.get("scheme") == "https":
                cookie += "; Secure"  # (over HTTPS: never sent over plain HTTP)
            headers.append((b"set-cookie", cookie.encode()))
        return await send_answer(send, HTTPResponse(200, headers, body))

    def _token_given(self, scope: Scope) -> bool:
        if not self._token:
            return False
        offered = _query_token(scope) or _bearer(scope) or _cookie(scope)
        return bool(offered) and hmac.compare_digest(offered.encode(), self._token.encode())

    def _may_view(self, scope: Scope, token_given: bool) -> bool:
        client = scope.get("client")
        return token_given or allowed(self._viewers_allowed, client[0] if client else None)

    # ------------------------------------------------------------------ the stream

    async def _stream(self, receive: Receive, send: Send, request_id: str) -> int:
        if len(self._feeds) >= MAX_VIEWERS:
            return await send_answer(send, unavailable("too many dashboard pages are open", request_id))
        feed: asyncio.Queue[bytes] = asyncio.Queue(maxsize=1)
        self._feeds.add(feed)
        if self._sampler is None or self._sampler.done():
            self._sampler = asyncio.get_running_loop().create_task(self._sample())
        left = asyncio.ensure_future(_disconnected(receive))
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            headers = [
                (b"content-type", b"text/event-stream"),
                (b"x-request-id", request_id.encode()),
                *_SECURITY_HEADERS,
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"retry: 2000\n\n", "more_body": True})
            async with asyncio.timeout(STREAM_LIFETIME_S):
                while True:
                    update = asyncio.ensure_future(feed.get())
                    await asyncio.wait({update, left, closed}, return_when=asyncio.FIRST_COMPLETED)
                    if not update.done():
                        update.cancel()
                        break
                    await send({"type": "http.response.body", "body": update.result(), "more_body": True})
        except TimeoutError:
            pass  # the stream's lifetime is over; the page reconnects
        finally:
            left.cancel()
            closed.cancel()
            self._feeds.discard(feed)
            if not self._feeds and self._sampler is not None:
                self._sampler.cancel()
                self._sampler = None
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": b""})
        return 200

    async def _sample(self) -> None:
        """While a page is open: every PERIOD_S, build the state and hand it to each."""
        while self._feeds:
            started = time.monotonic()
            try:
                event = await self._event()
            except Exception:
                logger.exception("The dashboard could not build its state")
                event = b""
            for feed in list(self._feeds):
                if feed.full():
                    feed.get_nowait()  # a page that fell behind gets the newest state only
                if event:
                    feed.put_nowait(event)
            await asyncio.sleep(max(0.0, PERIOD_S - (time.monotonic() - started)))

    async def _event(self) -> bytes:
        status: ServeStatus | None = None
        error = ""
        processes, answer = await asyncio.gather(self._gather(), self._read_status(), return_exceptions=True)
        if isinstance(answer, BaseException):
            error = f"the controller did not answer ({type(answer).__name__})"
        else:
            status = answer
        if isinstance(processes, BaseException):
            processes = [snapshot()]
        # Every process of the node that answers HTTP counts: the proxy, and the ingress
        # replicas that serve the connections it handed them (direct ingress).
        served = [family for process in processes for family in process]
        routes = self._rates.update(served, time.monotonic())
        state = view(status, processes, routes, time.time(), error)
        return b"data: " + json.dumps(state, separators=(",", ":")).encode() + b"\n\n"

    async def _read_status(self) -> ServeStatus:
        if self._status is None:
            raise LookupError("no status source")
        async with asyncio.timeout(_STATUS_TIMEOUT_S):
            return await self._status()


def _query_token(scope: Scope) -> str:
    query: dict[str, list[str]] = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return query.get("token", [""])[0]


def _bearer(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            return str(value[7:].decode("latin-1").strip())
    return ""


def _cookie(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            jar: SimpleCookie = SimpleCookie()
            with contextlib.suppress(CookieError):
                jar.load(value.decode("latin-1"))
            if _COOKIE in jar:
                return str(jar[_COOKIE].value)
    return ""


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
