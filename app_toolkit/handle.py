"""Handles: call a deployment's methods from routes, other deployments or a script.

``await handle.method.remote(x)`` in async code, ``handle.remote(x).result(timeout_s=5)``
in sync code. Requests queue in the caller (``max_queued_requests``; beyond it
``BackPressureError``) and go to the replica with fewer of this caller's requests in flight.
"""

from __future__ import annotations

import pickle
import uuid
import weakref
from collections.abc import Generator
from typing import Any

from app_toolkit._runtime import request_context
from app_toolkit._runtime.backends.base import current_session
from app_toolkit._runtime.channel.frames import Kind
from app_toolkit._runtime.messages import CallFailure, DeploymentID, MethodCall
from app_toolkit._runtime.routing.data_plane import DataPlane, Pending, in_async_code
from app_toolkit._runtime.routing.dispatcher import Reply
from app_toolkit.exceptions import (
    DeploymentCallError,
    ReplicaUnavailableError,
    RequestTimeoutError,
)


class DeploymentResponse:
    """The future result of one handle call: ``await`` it or call :meth:`result`."""

    __slots__ = ("_pending",)

    def __init__(self, pending: Pending[Any]) -> None:
        self._pending = pending

    def __await__(self) -> Generator[Any, None, Any]:
        return self._pending.__await__()

    def result(self, timeout_s: float | None = None) -> Any:
        """Block until the result is ready (sync code only); raise what the method raised."""
        try:
            return self._pending.result(timeout_s)
        except TimeoutError:
            self._pending.cancel()
            raise RequestTimeoutError(f"No result within {timeout_s} s") from None

    def cancel(self) -> None:
        """Cancel the call wherever it is (queued or running)."""
        self._pending.cancel()

    def done(self) -> bool:
        return self._pending.done()


class _Stream:
    """One streamed call, on the data plane's loop: its exchange and replica slot."""

    __slots__ = ("_plane", "_deployment", "_call", "_reply", "done", "__weakref__")

    def __init__(self, plane: DataPlane, deployment: DeploymentID, call: MethodCall) -> None:
        self._plane = plane
        self._deployment = deployment
        self._call = call
        self._reply: Reply | None = None
        self.done = False

    async def next(self) -> Any:
        if self.done:
            raise StopAsyncIteration
        try:
            if self._reply is None:
                self._plane.hold(self.finish)  # closing the data plane ends the stream
                self._reply = await _send_call(self._plane, self._deployment, self._call)
                kind, message = self._reply.kind, self._reply.message
            else:
                kind, message = await self._reply.exchange.recv()
        except BaseException:
            self.finish()
            raise
        if kind is Kind.ITEM:
            return message
        self.finish()
        if kind is Kind.END:
            raise StopAsyncIteration
        if kind is Kind.FAILURE:
            raise _exception(message)
        raise ReplicaUnavailableError(f"The stream from {self._deployment} was lost")

    def finish(self) -> None:
        """Stop the stream and give its replica slot back (on the data plane's loop)."""
        if self.done:
            return
        self.done = True
        self._plane.release(self.finish)
        if self._reply is not None:
            self._reply.exchange.cancel()
            self._reply.release()


class DeploymentResponseGenerator:
    """The items a generator method yields, as it yields them.

    Iterate with ``async for`` in async code or ``for`` in sync code. Stopping early
    (:meth:`cancel`, or the consuming task being cancelled) closes the generator on the
    replica. The stream belongs to the process's data plane: a generator dropped
    mid-stream without ``cancel()`` is handed back to it to close, and closing the data
    plane (shutdown) ends every open stream.
    """

    def __init__(self, plane: DataPlane, stream: _Stream) -> None:
        self._plane = plane
        self._stream = stream
        # Dropped without cancel(): the data plane closes the stream on its own loop.
        finalizer = weakref.finalize(self, plane.call_soon, stream.finish)
        finalizer.atexit = False

    def __aiter__(self) -> DeploymentResponseGenerator:
        return self

    async def __anext__(self) -> Any:
        if self._plane.on_loop():
            return await self._stream.next()
        return await self._plane.submit(self._stream.next())

    def __iter__(self) -> DeploymentResponseGenerator:
        return self

    def __next__(self) -> Any:
        if in_async_code():
            raise RuntimeError("Use `async for` to read a stream inside async code")
        try:
            return self._plane.run(self._stream.next())
        except StopAsyncIteration:
            raise StopIteration from None

    def cancel(self) -> None:
        """Stop the stream: the replica closes the generator."""
        self._plane.call_soon(self._stream.finish)


class _MethodCaller:
    def __init__(self, handle: DeploymentHandle, method: str) -> None:
        self._handle = handle
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._handle.options(method_name=self._method).remote(*args, **kwargs)


class DeploymentHandle:
    """A picklable reference to a deployment; pass it around, call its methods."""

    def __init__(
        self, deployment_name: str, app_name: str, *, method_name: str = "__call__", stream: bool = False
    ) -> None:
        self.deployment_name = deployment_name
        self.app_name = app_name
        self.method_name = method_name
        self.stream = stream
        self._id = DeploymentID(app_name, deployment_name)

    def options(self, *, method_name: str | None = None, stream: bool | None = None) -> DeploymentHandle:
        """A copy calling ``method_name`` by default; ``stream=True`` for generator methods,
        whose ``remote()`` then returns a :class:`DeploymentResponseGenerator`."""
        return DeploymentHandle(
            self.deployment_name,
            self.app_name,
            method_name=method_name or self.method_name,
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
        plane = session.data_plane
        request_id = request_context.request_id.get() or uuid.uuid4().hex
        if self.stream:
            call = MethodCall(request_id, self.method_name, args, kwargs, stream=True)
            return DeploymentResponseGenerator(plane, _Stream(plane, self._id, call))
        return DeploymentResponse(
            plane.submit(_call(plane, self._id, self.method_name, args, kwargs, request_id))
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_handle, (self.deployment_name, self.app_name, self.method_name, self.stream))

    def __repr__(self) -> str:
        return f"DeploymentHandle(deployment={self.deployment_name!r}, app={self.app_name!r})"


def _rebuild_handle(
    deployment_name: str, app_name: str, method_name: str, stream: bool = False
) -> DeploymentHandle:
    return DeploymentHandle(deployment_name, app_name, method_name=method_name, stream=stream)


async def _send_call(plane: DataPlane, deployment: DeploymentID, call: MethodCall) -> Reply:
    """Deliver one call; responses passed as arguments are resolved first (chaining)."""
    args = tuple([await _resolve(arg) for arg in call.args])
    kwargs = {key: await _resolve(value) for key, value in call.kwargs.items()}
    dispatcher = plane.dispatcher(deployment)
    return await dispatcher.send(
        Kind.CALL, MethodCall(call.request_id, call.method, args, kwargs, stream=call.stream)
    )


async def _resolve(value: Any) -> Any:
    if isinstance(value, DeploymentResponse):
        return await value
    return value


async def _call(
    plane: DataPlane,
    deployment: DeploymentID,
    method: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    request_id: str,
) -> Any:
    reply = await _send_call(plane, deployment, MethodCall(request_id, method, args, kwargs))
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
        except Exception:  # noqa: BLE001 - not unpicklable here: fall back to type and message
            pass
    return DeploymentCallError(failure.type_name, failure.message)
