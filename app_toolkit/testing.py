"""Test an application without a cluster: the local backend behind an httpx client.

``TestClient(app)`` deploys ``app`` on the local backend (same controller, routing,
queueing, backpressure and error handling as on Ray) and sends requests through the
same proxy, in process. Responses stream (``client.stream(...)`` reads SSE line by line
while the app produces it; leaving the block early is a client disconnect), and
``client.websocket_connect(path)`` opens a WebSocket, as with Starlette's TestClient.
Close it (or use ``with``) to shut the backend down. ``http_options`` are the proxy's
(API keys, limits, CORS of the front...), as ``start(http_options=...)`` takes them;
nothing listens on a port either way.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from app_toolkit._runtime.backends.base import (
    current_session,
    session_factory,
    set_current_session,
)
from app_toolkit._runtime.front.http_front import HTTPFront
from app_toolkit._runtime.inprocess import InProcessTransport, WebSocketSession
from app_toolkit.api import run, shutdown
from app_toolkit.config import HTTPOptions
from app_toolkit.deployment import Application
from app_toolkit.exceptions import ConfigError
from app_toolkit.handle import DeploymentHandle

_UNSET: Any = object()


class TestClient(httpx.Client):
    """An ``httpx.Client`` for one application served by the in-process local backend."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        app: Application,
        *,
        name: str | None = None,
        route_prefix: str | None = _UNSET,
        base_url: str = "http://testserver",
        timeout: float = 30.0,
        http_options: HTTPOptions | Mapping[str, object] | None = None,
    ) -> None:
        if current_session(create=False) is not None:
            raise ConfigError(
                "A toolkit backend is already running in this process; call shutdown() "
                "before creating a TestClient"
            )
        http = None
        if http_options is not None:  # no port either way: requests stay in-process
            given = (
                http_options
                if isinstance(http_options, HTTPOptions)
                else HTTPOptions.model_validate(http_options)
            )
            http = given.model_copy(update={"proxy_location": "Disabled"})
        session = session_factory("local").start(None, http)
        set_current_session(session)
        try:
            kwargs: dict[str, Any] = {} if route_prefix is _UNSET else {"route_prefix": route_prefix}
            self.handle: DeploymentHandle = run(app, name=name, backend="local", **kwargs)
            # The app runs; its routes reach the proxy a moment later, over the table the
            # proxy follows. Requests sent at once must not find them missing (404).
            proxy = session.proxy_app
            assert isinstance(proxy, HTTPFront)
            if session.status().applications[self.handle.app_name].route_prefix is not None:
                deadline = time.monotonic() + timeout
                while not proxy.routes(self.handle.app_name):
                    if time.monotonic() > deadline:
                        raise ConfigError("The proxy did not get the application's routes in time")
                    time.sleep(0.005)
        except BaseException:
            shutdown()
            raise
        assert session.proxy_app is not None
        self._session = session
        super().__init__(
            transport=InProcessTransport(session.data_plane, session.proxy_app),
            base_url=base_url,
            timeout=timeout,
        )

    def websocket_connect(
        self, url: str, subprotocols: Sequence[str] | None = None, headers: Mapping[str, str] | None = None
    ) -> WebSocketSession:
        """Open a WebSocket to ``url`` (a path) through the proxy; use it with ``with``.

        Raises ``starlette.websockets.WebSocketDisconnect`` if the app refuses it.
        """
        assert self._session.proxy_app is not None
        all_headers = httpx.Headers(headers)
        if subprotocols:
            all_headers["sec-websocket-protocol"] = ", ".join(subprotocols)
        target = self.base_url.join(url).copy_with(scheme="ws")
        read_s = self.timeout.read if self.timeout.read is not None else 30.0
        return WebSocketSession(
            self._session.data_plane, self._session.proxy_app, target, all_headers, read_s
        )

    def close(self) -> None:
        super().close()
        if current_session(create=False) is not None:
            shutdown()

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
