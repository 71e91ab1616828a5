"""What the proxy knows about one HTTP request while it forwards it, and how it learns
that the client went away."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Receive

from app_toolkit._runtime.proxy.http_guard import RequestLink

#: nginx's status for "the client closed the connection": it went away first.
CLIENT_CLOSED = 499


class RequestState:
    """What the proxy knows about one request while it serves it; what its metrics and
    access log line say once it is done."""

    __slots__ = (
        "task",
        "arrived",
        "request_id",
        "app",
        "prefix",
        "target",
        "started",
        "finished",
        "disconnected",
        "status",
        "route",
        "link",
        "uploading",
        "logged",
    )

    def __init__(self, task: asyncio.Task[Any] | None, arrived: float) -> None:
        self.task = task
        self.arrived = arrived  # perf_counter() when the request reached the proxy
        self.request_id = "-"
        self.app = ""  # the application it went to
        self.prefix = ""  # that app's route_prefix, "" for "/"
        self.target = ""  # what it was sent to (an app's prefix, a /-/ page) until ``route`` is known
        self.status = 500  # the status sent to the client (499: it left), unless one was sent
        self.started = False  # the response head went to the client
        self.finished = False  # the whole response went to the client
        self.disconnected = False
        self.route = ""  # the path template the replica's app matched
        self.link: RequestLink | None = None  # what our HTTP protocol offers beyond ASGI
        #: The app is reading a body that has not fully arrived (direct ingress): a
        #: deadline passing now is the upload's (408), not the app's (504).
        self.uploading = False
        self.logged = True  # it gets an access line (its application's enable_access_log)

    @property
    def label(self) -> str:
        """The route for metrics and the access log: the app's prefix and the template
        its app matched, else what the request was sent to (never the raw path)."""
        return self.prefix + self.route if self.route else self.target

    def client_left(self) -> None:
        """The client went away: cancel the request wherever it is (servers also report a
        "disconnect" once the response is complete; that is not a client going away)."""
        if not self.finished and self.task is not None:
            self.disconnected = True
            self.task.cancel()

    def left(self) -> bool:
        """In an ``except CancelledError`` around a request: True if the cancellation is
        the one :meth:`client_left` asked for, now handled (the request's status is 499);
        False if it came from elsewhere (re-raise it)."""
        if not self.disconnected:
            return False
        if self.task is not None:
            self.task.uncancel()
        self.status = CLIENT_CLOSED
        return True


async def abort_response(state: RequestState, why: str) -> None:
    """End the client's connection without completing the response (it failed after its
    head went out): the client must not take what it got for a whole response."""
    state.finished = True
    if state.link is None:  # under another server: raising is how a response is cut off
        raise ResponseAborted(f"{why} after the response started")
    state.link.abort()
    await asyncio.sleep(0)  # the protocol hears the connection end: no "incomplete" error


class ResponseAborted(Exception):
    """Raised to a foreign ASGI server to make it cut a started response off."""


async def watch_disconnect(receive: Receive, state: RequestState) -> None:
    """Under a server without our protocol's :class:`RequestLink`: wait on ``receive()``
    for the ``http.disconnect`` message."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
    state.client_left()
