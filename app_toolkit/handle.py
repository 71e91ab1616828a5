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
from app_toolkit._runtime.dispatcher import Reply
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


class DeploymentResponseGenerator:
    """The items a generator method yields, as it yields them.

    Iterate with ``async for`` in async code or ``for`` in sync code. Stopping early
    (``break`` then :meth:`cancel`, or the consuming task being cancelled) closes the
    generator on the replica.
    """

    def __init__(self, session: Session, deployment: DeploymentID, call: MethodCall,
                 home: asyncio.AbstractEventLoop | None) -> None:
        self._session = session
        self._deployment = deployment
        self._call = call
        self._reply: Reply | None = None
        self._done = False
        # Where the exchange lives: fixed at the first step.
        self._home = home
        self._loop: asyncio.AbstractEventLoop | None = None

    def __aiter__(self) -> DeploymentResponseGenerator:
        return self

    async def __anext__(self) -> Any:
        loop = self._home or asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        if self._loop is asyncio.get_running_loop():
            return await self._next()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._next(), self._loop))

    def __iter__(self) -> DeploymentResponseGenerator:
        return self

    def __next__(self) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("Use `async for` to read a stream inside async code")
        if self._loop is None:
            self._loop = self._home or self._session.background().loop
        try:
            return asyncio.run_coroutine_threadsafe(self._next(), self._loop).result()
        except StopAsyncIteration:
            raise StopIteration from None

    async def _next(self) -> Any:
        if self._done:
            raise StopAsyncIteration
        try:
            if self._reply is None:
                self._reply = await _send_call(self._session, self._deployment, self._call)
                kind, message = self._reply.kind, self._reply.message
            else:
                kind, message = await self._reply.exchange.recv()
        except BaseException:
            self._finish()
            raise
        if kind is Kind.ITEM:
            return message
        self._finish()
        if kind is Kind.END:
            raise StopAsyncIteration
        if kind is Kind.FAILURE:
            raise _exception(message)
        raise ReplicaUnavailableError(f"The stream from {self._deployment} was lost")

    def _finish(self) -> None:
        self._done = True
        if self._reply is not None:
            self._reply.exchange.cancel()
            self._reply.release()

    def cancel(self) -> None:
        """Stop the stream: the replica closes the generator."""
        if self._done:
            return
        loop = self._loop
        if loop is None or loop.is_closed():
            self._done = True
            return
        loop.call_soon_threadsafe(self._finish)

    def __del__(self) -> None:
        # Abandoned mid-stream without cancel(): free the replica's slot anyway.
        if not self._done and self._reply is not None:
            self.cancel()


class _MethodCaller:
    def __init__(self, handle: DeploymentHandle, method: str) -> None:
        self._handle = handle
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._handle.options(method_name=self._method).remote(*args, **kwargs)


class DeploymentHandle:
    """A picklable reference to a deployment; pass it around, call its methods."""

    def __init__(self, deployment_name: str, app_name: str, *, method_name: str = "__call__",
                 stream: bool = False) -> None:
        self.deployment_name = deployment_name
        self.app_name = app_name
        self.method_name = method_name
        self.stream = stream
        self._id = DeploymentID(app_name, deployment_name)

    def options(self, *, method_name: str | None = None, stream: bool | None = None) -> DeploymentHandle:
        """A copy calling ``method_name`` by default; ``stream=True`` for generator methods,
        whose ``remote()`` then returns a :class:`DeploymentResponseGenerator`."""
        return DeploymentHandle(
            self.deployment_name, self.app_name, method_name=method_name or self.method_name,
            stream=self.stream if stream is None else stream,
        )

    def __getattr__(self, name: str) -> _MethodCaller:
        if name.startswith("_"):
            raise AttributeError(name)
        return _MethodCaller(self, name)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Send the call now; returns a DeploymentResponse to await or ``result()``
        (a DeploymentResponseGenerator to iterate with ``stream=True``)."""
        session = current_session()
        assert session is not None
        if self.stream:
            call = MethodCall(request_context.request_id.get() or uuid.uuid4().hex, self.method_name,
                              args, kwargs, stream=True)
            return DeploymentResponseGenerator(session, self._id, call, session.home_loop())
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
        return (_rebuild_handle, (self.deployment_name, self.app_name, self.method_name, self.stream))

    def __repr__(self) -> str:
        return f"DeploymentHandle(deployment={self.deployment_name!r}, app={self.app_name!r})"


def _rebuild_handle(deployment_name: str, app_name: str, method_name: str,
                   stream: bool = False) -> DeploymentHandle:
    return DeploymentHandle(deployment_name, app_name, method_name=method_name, stream=stream)


async def _send_call(session: Session, deployment: DeploymentID, call: MethodCall) -> Reply:
    """Deliver one call; responses passed as arguments are resolved first (chaining)."""
    args = tuple([await _resolve(arg) for arg in call.args])
    kwargs = {key: await _resolve(value) for key, value in call.kwargs.items()}
    dispatcher = session.subscriber().dispatcher(deployment)
    return await dispatcher.send(
        Kind.CALL, MethodCall(call.request_id, call.method, args, kwargs, stream=call.stream))


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
    call = MethodCall(parent_request_id or uuid.uuid4().hex, method, args, kwargs)
    reply = await _send_call(session, deployment, call)
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
