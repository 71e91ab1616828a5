"""Test an application without a cluster: the local backend behind an httpx client.

``TestClient(app)`` deploys ``app`` on the local backend (same controller, routing,
queueing, backpressure and error handling as on Ray) and sends requests through the
same proxy, in process. Close it (or use ``with``) to shut the backend down.
"""

from __future__ import annotations

from typing import Any

import httpx

from app_toolkit._runtime.backends.base import (
    Session,
    current_session,
    session_factory,
    set_current_session,
)
from app_toolkit.api import run, shutdown
from app_toolkit.deployment import Application
from app_toolkit.exceptions import ConfigError
from app_toolkit.handle import DeploymentHandle

_UNSET: Any = object()


class _SessionTransport(httpx.BaseTransport):
    """Runs each request through the local session's proxy, on the session's loop."""

    def __init__(self, session: Session) -> None:
        assert session.proxy_app is not None
        self._session = session
        self._asgi = httpx.ASGITransport(app=session.proxy_app)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()

        async def forward() -> tuple[int, list[tuple[bytes, bytes]], bytes]:
            inner = httpx.Request(request.method, request.url, headers=request.headers, content=body)
            response = await self._asgi.handle_async_request(inner)
            content = await response.aread()
            return response.status_code, response.headers.raw, content

        status, headers, content = self._session.data_plane.run(forward())
        return httpx.Response(status, headers=headers, content=content, request=request)


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
    ) -> None:
        if current_session(create=False) is not None:
            raise ConfigError(
                "A toolkit backend is already running in this process; call shutdown() "
                "before creating a TestClient"
            )
        session = session_factory("local").start(None, None)  # no port: requests stay in-process
        set_current_session(session)
        try:
            kwargs: dict[str, Any] = {} if route_prefix is _UNSET else {"route_prefix": route_prefix}
            self.handle: DeploymentHandle = run(app, name=name, backend="local", **kwargs)
        except BaseException:
            shutdown()
            raise
        super().__init__(transport=_SessionTransport(session), base_url=base_url, timeout=timeout)

    def close(self) -> None:
        super().close()
        if current_session(create=False) is not None:
            shutdown()

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
