"""Handles: call a deployment's methods from routes, other deployments or a script.

``await handle.method.remote(x)`` in async code, ``handle.remote(x).result(timeout_s=5)``
in sync code. Requests queue in the caller (``max_queued_requests``; beyond it
``BackPressureError``) and go to the replica with fewer of this caller's requests in flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import pickle
import uuid
from typing import Any, Generator

from app_toolkit._runtime import request_context
from app_toolkit._runtime.channel import Kind
from app_toolkit._runtime.messages import CallFailure, DeploymentID, MethodCall
from app_toolkit._runtime.session import Session, current_session
from app_toolkit.exceptions import (
    DeploymentCallError,
    ReplicaUnavailableError,
    RequestTimeoutError,
)


class DeploymentResponse:
    """The future result of one handle call: ``await`` it or call :meth:`result`."""

    def __init__(self, task: asyncio.Future[Any] | concurrent.futures.Future[Any]) -> None:
        self._future = task

    def __await__(self) -> Generator[Any, None, Any]:
        future = self._future
        if isinstance(future, concurrent.futures.Future):
            return asyncio.wrap_future(future).__await__()
        return future.__await__()

    def result(self, timeout_s: float | None = None) -> Any:
        """Block until the result is ready (sync code only); raise what the method raised."""
        future = self._future
        if not isinstance(future, concurrent.futures.Future):
            raise RuntimeError(
                "result() blocks, so it cannot be used inside async code; use "
                "`await handle.method.remote(...)` there"
            )
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RequestTimeoutError(f"No result within {timeout_s} s") from None

    def cancel(self) -> None:
        """Cancel the call wherever it is (queued or running)."""
        self._future.cancel()

    def done(self) -> bool:
        return self._future.done()


class _MethodCaller:
    def __init__(self, handle: DeploymentHandle, method: str) -> None:
        self._handle = handle
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> DeploymentResponse:
        return self._handle.options(method_name=self._method).remote(*args, **kwargs)


class DeploymentHandle:
    """A picklable reference to a deployment; pass it around, call its methods."""

    def __init__(self, deployment_name: str, app_name: str, *, method_name: str = "__call__") -> None:
        self.deployment_name = deployment_name
        self.app_name = app_name
        self.method_name = method_name
        self._id = DeploymentID(app_name, deployment_name)

    def options(self, *, method_name: str | None = None) -> DeploymentHandle:
        """A copy of this handle calling ``method_name`` by default."""
        return DeploymentHandle(
            self.deployment_name, self.app_name, method_name=method_name or self.method_name
        )

    def __getattr__(self, name: str) -> _MethodCaller:
        if name.startswith("_"):
            raise AttributeError(name)
        return _MethodCaller(self, name)

    def remote(self, *args: Any, **kwargs: Any) -> DeploymentResponse:
        """Send the call now; returns a DeploymentResponse to await or ``result()``."""
        session = current_session()
        assert session is not None
        coroutine = _call(session, self._id, self.method_name, args, kwargs, request_context.request_id.get())
        home = session.home_loop()
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and (home is None or home is running):
            return DeploymentResponse(running.create_task(coroutine))
        if home is not None:
            return DeploymentResponse(asyncio.run_coroutine_threadsafe(coroutine, home))
        return DeploymentResponse(session.background().submit(coroutine))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_handle, (self.deployment_name, self.app_name, self.method_name))

    def __repr__(self) -> str:
        return f"DeploymentHandle(deployment={self.deployment_name!r}, app={self.app_name!r})"


def _rebuild_handle(deployment_name: str, app_name: str, method_name: str) -> DeploymentHandle:
    return DeploymentHandle(deployment_name, app_name, method_name=method_name)


async def _resolve(value: Any) -> Any:
    if isinstance(value, DeploymentResponse):
        return await value
    return value


async def _call(
    session: Session,
    deployment: DeploymentID,
    method: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    parent_request_id: str,
) -> Any:
    # Responses passed as arguments are resolved first, so deployments can be chained.
    args = tuple([await _resolve(arg) for arg in args])
    kwargs = {key: await _resolve(value) for key, value in kwargs.items()}
    dispatcher = session.subscriber().dispatcher(deployment)
    call = MethodCall(parent_request_id or uuid.uuid4().hex, method, args, kwargs)
    reply = await dispatcher.send(Kind.CALL, call)
    try:
        if reply.kind is Kind.RESULT:
            return reply.message
        if reply.kind is Kind.FAILURE:
            raise _exception(reply.message)
        raise ReplicaUnavailableError(f"Unexpected reply {reply.kind.name} from {deployment}")
    finally:
        reply.exchange.cancel()
        reply.release()


def _exception(failure: CallFailure) -> Exception:
    if failure.exception is not None:
        try:
            exc = pickle.loads(failure.exception)
            if isinstance(exc, Exception):
                return exc
        except Exception:
            pass
    return DeploymentCallError(failure.type_name, failure.message)
