"""Handles: call a deployment's methods from routes, other deployments or a script.

``await handle.method.remote(x)`` in async code, ``handle.remote(x).result(timeout_s=5)``
in sync code. Requests queue in the caller (``max_queued_requests``; beyond it
``BackPressureError``) and go to the replica with fewer of this caller's requests in flight,
or by their shard key or session id. ``handle.broadcast(...)`` calls every replica.
What the calls return is in ``app_toolkit.responses``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any, Generic, Literal, overload

from typing_extensions import TypeVar  # defaults (PEP 696): a bare DeploymentHandle means any

from app_toolkit._runtime import request_context, tracing
from app_toolkit._runtime.backends.base import current_session
from app_toolkit._runtime.messages import DeploymentID, MethodCall
from app_toolkit._runtime.request_keys import routing_key
from app_toolkit._runtime.routing import broadcast, caller_metrics
from app_toolkit._runtime.routing.data_plane import DataPlane
from app_toolkit._runtime.routing.replica_client import Reply
from app_toolkit._runtime.routing.replies import value_of
from app_toolkit._runtime.routing.streamed_calls import StreamedCall
from app_toolkit.responses import DeploymentBroadcastResponse, DeploymentResponse, DeploymentResponseGenerator

#: The deployment class a handle reaches, for annotations only (``DeploymentHandle[Model]``).
D = TypeVar("D", default=Any)


class _MethodCaller(Generic[D]):
    """``handle.method``: call one method of the deployment."""

    __slots__ = ("_handle", "_method")

    def __init__(self, handle: DeploymentHandle[D], method: str) -> None:
        self._handle = handle
        self._method = method

    def remote(self, *args: object, **kwargs: object) -> DeploymentResponse[Any]:
        return self._handle.options(method_name=self._method).remote(*args, **kwargs)


class _StreamingMethodCaller(Generic[D]):
    """``streaming_handle.method``: stream the items one generator method yields."""

    __slots__ = ("_handle", "_method")

    def __init__(self, handle: StreamingDeploymentHandle[D], method: str) -> None:
        self._handle = handle
        self._method = method

    def remote(self, *args: object, **kwargs: object) -> DeploymentResponseGenerator[Any]:
        return self._handle.options(method_name=self._method, stream=True).remote(*args, **kwargs)


class DeploymentHandle(Generic[D]):
    """A picklable reference to a deployment; pass it around, call its methods.

    ``handle.remote(x)`` and ``handle.method.remote(x)`` return a
    :class:`DeploymentResponse`; on ``handle.options(stream=True)`` they return a
    :class:`DeploymentResponseGenerator`.
    """

    stream = False

    def __init__(
        self,
        deployment_name: str,
        app_name: str,
        *,
        method_name: str = "__call__",
        multiplexed_model_id: str = "",
        shard_key: str = "",
        session_id: str = "",
    ) -> None:
        self.deployment_name = deployment_name
        self.app_name = app_name
        self.method_name = method_name
        self.multiplexed_model_id = multiplexed_model_id
        self.shard_key = shard_key
        self.session_id = session_id
        self._id = DeploymentID(app_name, deployment_name)

    @overload
    def options(
        self,
        *,
        method_name: str | None = None,
        stream: Literal[True],
        multiplexed_model_id: str | None = None,
        shard_key: str | None = None,
        session_id: str | None = None,
    ) -> StreamingDeploymentHandle[D]: ...

    @overload
    def options(
        self,
        *,
        method_name: str | None = None,
        stream: Literal[False] | None = None,
        multiplexed_model_id: str | None = None,
        shard_key: str | None = None,
        session_id: str | None = None,
    ) -> DeploymentHandle[D]: ...

    def options(
        self,
        *,
        method_name: str | None = None,
        stream: bool | None = None,
        multiplexed_model_id: str | None = None,
        shard_key: str | None = None,
        session_id: str | None = None,
    ) -> DeploymentHandle[D]:
        """A copy calling ``method_name`` by default; ``stream=True`` for generator methods,
        whose ``remote()`` then returns a :class:`DeploymentResponseGenerator`;
        ``multiplexed_model_id`` sends calls to replicas holding that model (see
        :func:`~app_toolkit.multiplexed`); ``shard_key`` sends every call with the same
        key to the same replica while it lives (the deployment's ``affinity`` option says
        what happens when that replica is full); ``session_id`` (Ray Serve's name) does
        the same for a session, unless a ``shard_key`` is set too: then the shard key
        picks the replica."""
        streaming = self.stream if stream is None else stream
        kind = StreamingDeploymentHandle if streaming else DeploymentHandle
        return kind(
            self.deployment_name,
            self.app_name,
            method_name=method_name or self.method_name,
            multiplexed_model_id=self.multiplexed_model_id
            if multiplexed_model_id is None
            else multiplexed_model_id,
            shard_key=self.shard_key if shard_key is None else shard_key,
            session_id=self.session_id if session_id is None else session_id,
        )

    def __getattr__(self, name: str) -> _MethodCaller[D]:
        if name.startswith("_"):
            raise AttributeError(name)
        return _MethodCaller(self, name)

    def remote(self, *args: object, **kwargs: object) -> DeploymentResponse[Any]:
        """Send the call now; returns a DeploymentResponse to ``await`` or ``result()``."""
        plane = _data_plane()
        request_id = _request_id()
        trace, span = tracing.client_span(f"call {self.deployment_name}.{self.method_name}")
        call = MethodCall(
            request_id,
            self.method_name,
            args,
            kwargs,
            model_id=self.multiplexed_model_id,
            shard_key=routing_key(self.shard_key, self.session_id),
            trace=trace.traceparent if trace else "",
            tracestate=trace.state if trace else "",
            share=request_context.current_share(),
        )
        return DeploymentResponse(plane.submit(_call(plane, self._id, call, span)))

    def broadcast(self, method_name: str, *args: object, **kwargs: object) -> DeploymentBroadcastResponse:
        """Call ``method_name`` with these arguments on every replica of the deployment
        (reload an adapter, flush a cache), as Ray Serve's ``handle.broadcast`` does.

        It reaches the replicas in this caller's replica table when it is sent: not one
        still starting or one that starts later (give those what they need in their
        constructor or through ``user_config``), nor one that is draining. The calls skip
        the caller-side queue and its ``max_queued_requests`` (never
        ``BackPressureError``), and each replica runs its call even when it already
        runs ``max_ongoing_requests``. Unary methods only; ``stream``, ``shard_key`` and
        ``session_id`` do not apply (a ``multiplexed_model_id`` is passed on)."""
        plane = _data_plane()
        trace, span = tracing.client_span(f"broadcast {self.deployment_name}.{method_name}")
        call = MethodCall(
            _request_id(),
            method_name,
            args,
            kwargs,
            model_id=self.multiplexed_model_id,
            trace=trace.traceparent if trace else "",
            tracestate=trace.state if trace else "",
            broadcast=True,
        )
        return DeploymentBroadcastResponse(plane.submit(_broadcast(plane, self._id, call, span)))

    def __reduce__(self) -> tuple[Callable[..., DeploymentHandle], tuple[str | bool, ...]]:
        return (
            _rebuild_handle,
            (
                self.deployment_name,
                self.app_name,
                self.method_name,
                self.stream,
                self.multiplexed_model_id,
                self.shard_key,
                self.session_id,
            ),
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(deployment={self.deployment_name!r}, app={self.app_name!r})"


class StreamingDeploymentHandle(DeploymentHandle[D]):
    """``handle.options(stream=True)``: each call streams what a generator method yields."""

    stream = True

    def __getattr__(self, name: str) -> _StreamingMethodCaller[D]:  # type: ignore[override] # streams, by design
        if name.startswith("_"):
            raise AttributeError(name)
        return _StreamingMethodCaller(self, name)

    def remote(self, *args: object, **kwargs: object) -> DeploymentResponseGenerator[Any]:  # type: ignore[override] # streams, by design
        """Send the call now; returns a DeploymentResponseGenerator to iterate."""
        plane = _data_plane()
        trace, span = tracing.client_span(f"call {self.deployment_name}.{self.method_name}")
        call = MethodCall(
            _request_id(),
            self.method_name,
            args,
            kwargs,
            stream=True,
            model_id=self.multiplexed_model_id,
            shard_key=routing_key(self.shard_key, self.session_id),
            trace=trace.traceparent if trace else "",
            tracestate=trace.state if trace else "",
            share=request_context.current_share(),
        )
        return DeploymentResponseGenerator(plane, StreamedCall(plane, self._id, call, _resolved, span))


def _data_plane() -> DataPlane:
    session = current_session()
    assert session is not None
    return session.data_plane


def _request_id() -> str:
    """The request being served (downstream calls carry its id on), or a new id."""
    return request_context.current_request_id() or uuid.uuid4().hex


def _rebuild_handle(
    deployment_name: str,
    app_name: str,
    method_name: str,
    stream: bool = False,
    model_id: str = "",
    shard_key: str = "",
    session_id: str = "",
) -> DeploymentHandle[object]:
    kind = StreamingDeploymentHandle if stream else DeploymentHandle
    return kind(
        deployment_name,
        app_name,
        method_name=method_name,
        multiplexed_model_id=model_id,
        shard_key=shard_key,
        session_id=session_id,
    )


async def _send_call(plane: DataPlane, deployment: DeploymentID, call: MethodCall) -> Reply:
    """Deliver one call, its arguments resolved first (:func:`_resolved`)."""
    dispatcher = plane.dispatcher(deployment)
    return await dispatcher.send(await _resolved(call), call.model_id, call.shard_key)


async def _resolved(call: MethodCall) -> MethodCall:
    """``call`` with the responses passed as its arguments awaited (chaining)."""
    args = tuple([await _resolve(arg) for arg in call.args])
    kwargs = {key: await _resolve(value) for key, value in call.kwargs.items()}
    return dataclasses.replace(call, args=args, kwargs=kwargs)


async def _resolve(value: object) -> object:
    if isinstance(value, DeploymentResponse):
        return await value
    return value


async def _call(
    plane: DataPlane, deployment: DeploymentID, call: MethodCall, span: tracing.Span | None = None
) -> object:
    started = time.perf_counter()
    outcome = "error"  # unless a result arrives (or the caller cancels)
    try:
        value = value_of(await _send_call(plane, deployment, call), deployment)
        outcome = "ok"
        return value
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    finally:
        caller_metrics.called(deployment, call.method, outcome, time.perf_counter() - started)
        if span is not None:
            span.end("" if outcome == "ok" else outcome)


async def _broadcast(
    plane: DataPlane, deployment: DeploymentID, call: MethodCall, span: tracing.Span | None
) -> list[broadcast.Outcome]:
    error = "error"
    try:
        outcomes = await broadcast.fan_out(plane, deployment, await _resolved(call))
        error = "" if not any(isinstance(o, broadcast.Failed) for o in outcomes) else "error"
        return outcomes
    except asyncio.CancelledError:
        error = "cancelled"
        raise
    finally:
        if span is not None:
            span.end(error)
