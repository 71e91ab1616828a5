"""The replica: hosts one user class instance, function or ASGI app and serves requests.

Backend-independent: the Ray actor and the local backend both wrap a ``ReplicaCore``.
It never runs more than ``max_ongoing_requests`` at once (its slots: ``slots.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import inspect
import logging
import time
from collections.abc import Callable
from typing import cast

from starlette.types import ASGIApp, Receive, Scope

from app_toolkit._runtime import log_format, request_context, tracing
from app_toolkit._runtime.channel.frames import Dumps
from app_toolkit._runtime.channel.server import ResponseSink
from app_toolkit._runtime.drain_signal import LAST_EVENT_S, DrainSignal
from app_toolkit._runtime.messages import (
    END,
    DeploymentID,
    HTTPRequest,
    MethodCall,
    Request,
    WebSocketOpen,
)
from app_toolkit._runtime.replica import replica_metrics
from app_toolkit._runtime.replica.asgi import (
    ChannelResponse,
    ChannelSocket,
    Lifespan,
    failing_app,
    request_app,
)
from app_toolkit._runtime.replica.autoscaling_stats import AutoscalingStats
from app_toolkit._runtime.replica.calls import failure, find_method, log_call_failure, run_call
from app_toolkit._runtime.replica.ingress_app import ingress_app, serving_app
from app_toolkit._runtime.replica.routing_stats import RoutingStats
from app_toolkit._runtime.replica.run_app import HTTPOut, SocketOut, run_app
from app_toolkit._runtime.replica.slots import ReplicaSlots
from app_toolkit._runtime.replica.user_code import (
    call_maybe_async,
    call_reconfigure,
    construct,
    run_destructor,
    wants_reconfigure,
)
from app_toolkit._runtime.request_values import API_KEY_SHARE
from app_toolkit._runtime.tables import Outcomes
from app_toolkit._runtime.waiting import wait_event
from app_toolkit.config import DeploymentConfig
from app_toolkit.exceptions import (
    DeployError,
)
from app_toolkit.replica_id import ReplicaID

logger = logging.getLogger("app_toolkit.replica")

#: A deployment's constructor arguments: positional and keyword.
InitArgs = tuple[tuple[object, ...], dict[str, object]]


class ReplicaCore(ReplicaSlots):
    """One replica's serving logic, independent of how it is hosted."""

    def __init__(
        self,
        replica_id: str,
        deployment: DeploymentID,
        config: DeploymentConfig,
        definition: Callable[..., object],
        init_args: InitArgs,
        dumps: Dumps,
        rank: request_context.ReplicaRank | None = None,
        world_size: int = 0,
        owns_process: bool = False,
        code_version: str | None = None,
    ) -> None:
        self.replica_id = replica_id
        #: It is the only replica of its process (on Ray): its logging_config is the process's.
        self.owns_process = owns_process
        self.labels = (deployment.app, deployment.name, replica_id)  # for its metrics
        self.context = request_context.ReplicaContext(
            deployment.app,
            deployment.name,
            ReplicaID(replica_id, deployment),
            rank,
            world_size,
            code_version=code_version,
        )
        self.deployment = deployment
        self.config = config
        self._definition = definition
        self._init_args = init_args
        self._dumps = dumps
        super().__init__()  # its slots
        self._grace_s = config.graceful_shutdown_timeout_s  # its drain's (drain() may shorten it)
        self.instance: object = None
        self.asgi_app: ASGIApp | None = None
        self._lifespan: Lifespan | None = None
        #: The drain as open streams and WebSockets see it: when to end, and how soon.
        self.drain_signal = DrainSignal()
        #: Set by the host: tells the controller which multiplexed models this replica holds.
        self.report_models: request_context.ReportModels | None = None
        self._serves: request_context.Serving | None = None
        #: Run when the replica stops (request_context.stop_hooks).
        self._stop_hooks: list[request_context.StopHook] = []
        #: Samples the user's record_autoscaling_stats(), if it has one (started by start()).
        self.autoscaling_stats: AutoscalingStats | None = None
        #: Samples the user's record_routing_stats(), if it has one (started by start()).
        self.routing_stats: RoutingStats | None = None
        replica_metrics.track(self)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Build the user object, run lifespan startup and apply ``user_config``."""
        args, kwargs = self._init_args
        definition = self._definition
        self._follow_logging_config()
        request_context.enter_replica(self.context)
        request_context.stop_hooks.set(self._stop_hooks)  # a constructor may preload models
        try:
            if inspect.isclass(definition):
                self.instance = await construct(definition, args, kwargs)
                self.asgi_app = await ingress_app(definition, self.instance, self.deployment)
            else:
                self.instance = definition
        except Exception as exc:
            logger.exception("Constructor of %s failed", self.deployment)
            raise DeployError(f"{type(exc).__name__}: {exc}") from None
        # From here on (lifespan startup, reconfigure, requests) it names the instance.
        self.context = dataclasses.replace(self.context, servable_object=self.instance)
        request_context.enter_replica(self.context)
        if self.asgi_app is not None:
            self.asgi_app = serving_app(self.asgi_app, cast(type, definition))
            self._lifespan = Lifespan(self.asgi_app)
            token = request_context.replica_instance.set(self.instance)
            try:
                await self._lifespan.startup()
            finally:
                request_context.replica_instance.reset(token)
        if wants_reconfigure(self.instance, self.config.user_config):
            await self.reconfigure(self.config.user_config)
        if AutoscalingStats.wanted(self.instance):
            self.autoscaling_stats = AutoscalingStats(
                self.instance, self.replica_id, self.deployment, self.config
            )
            self.autoscaling_stats.start()
        if RoutingStats.wanted(self.instance):
            self.routing_stats = RoutingStats(self.instance, self.replica_id, self.deployment, self.config)
            self.routing_stats.start()

    @property
    def samples_stats(self) -> bool:
        """Whether it calls a statistics hook of the user's, whose results go with its
        process's load reports (``take_stats``)."""
        return self.autoscaling_stats is not None or self.routing_stats is not None

    def take_stats(self) -> Outcomes:
        """What its statistics hooks gave since the last take, for the next load report."""
        taken = (
            self.autoscaling_stats.take() if self.autoscaling_stats is not None else None,
            self.routing_stats.take() if self.routing_stats is not None else None,
        )
        return tuple(sample for sample in taken if sample is not None)

    async def stop_sampling(self) -> None:
        """Stop calling record_autoscaling_stats() and record_routing_stats() (the
        replica is stopping)."""
        for hook in (self.autoscaling_stats, self.routing_stats):
            if hook is not None:
                await hook.stop()

    async def reconfigure(self, user_config: object) -> None:
        await call_reconfigure(self.instance, user_config, self.context.rank, str(self.deployment))

    async def update_config(self, config: DeploymentConfig) -> None:
        """Take new in-place options; a changed ``user_config`` goes to reconfigure()."""
        old, self.config = self.config, config
        for hook in (self.autoscaling_stats, self.routing_stats):
            if hook is not None:
                hook.update(config)
        if config.logging_config != old.logging_config:
            self._follow_logging_config()
        if config.user_config != old.user_config and wants_reconfigure(self.instance, config.user_config):
            await self.reconfigure(config.user_config)

    def _follow_logging_config(self) -> None:
        """Log by this deployment's ``logging_config`` (its own, else its application's)."""
        deployment = self.deployment
        log_format.follow_deployment(
            deployment.app, deployment.name, self.config.logging_config, self.owns_process
        )

    async def check_health(self) -> None:
        """Raises if the user's ``check_health`` does; proves the event loop responds."""
        method = getattr(self.instance, "check_health", None)
        if method is not None:
            await call_maybe_async(method)

    def grace_s(self, shorter: float | None = None) -> float:
        """The grace period of a drain: ``graceful_shutdown_timeout_s``, or ``shorter``."""
        grace = self.config.graceful_shutdown_timeout_s
        return grace if shorter is None else min(grace, shorter)

    async def drain(self, hurry: bool = False, grace_s: float | None = None) -> None:
        """Refuse new work and let in-flight requests finish, for up to
        ``graceful_shutdown_timeout_s`` (``grace_s``: a shorter grace period, for a node
        that leaves sooner); then end the streams and WebSockets still open (each the way
        its clients understand) and run lifespan shutdown. ``hurry``: every stream and
        WebSocket ends at once (other requests still get the grace period)."""
        self.draining = True
        self.drain_signal.begin(hurry)
        await self.stop_sampling()
        loop = asyncio.get_running_loop()
        self._grace_s = self.grace_s(grace_s)
        await self.wait_until(0, loop.time() + self._grace_s)
        # The grace period is over: the streams and WebSockets still open end now, and get a
        # moment to write their last event (until every one has ended).
        self.drain_signal.end_streams()
        last_event_by = loop.time() + LAST_EVENT_S
        while self.drain_signal.watching and loop.time() < last_event_by:
            self._one_ended.clear()
            await wait_event(self._one_ended, min(0.05, last_event_by - loop.time()))
        self._drained_at = loop.time()
        if self._lifespan is not None:
            await self._lifespan.shutdown(timeout_s=max(self._grace_s, 1.0))
        await self._release_instance()
        if self.ongoing:
            logger.warning("%s stopping with %d requests still running", self.replica_id, self.ongoing)

    async def _release_instance(self) -> None:
        """The last step of stopping, as Ray Serve orders it: the user's ``__del__`` (an
        ``async def __del__`` awaited; then the requests still running get ``LAST_EVENT_S``
        to end, so that what it ended, a model's engine closed under its replies, answers
        the callers rather than dying with the process), then the stop hooks (models
        released, connections closed: after that moment, which may still use them), then
        the object let go (the process is killed next)."""
        if self.instance is not None and inspect.isclass(self._definition):
            try:
                ran = await run_destructor(self.instance, max(self._grace_s, 1.0))
            except Exception:
                ran = True
                logger.exception("The __del__ of %s failed", self.replica_id)
            if ran:
                await self.wait_until(0, asyncio.get_running_loop().time() + LAST_EVENT_S)
        for hook in self._stop_hooks:
            try:
                await hook()
            except Exception:
                logger.exception("A stop hook of %s failed", self.replica_id)
        self._stop_hooks.clear()
        if not inspect.isclass(self._definition):
            return  # a function deployment: nothing was built
        self.instance = self._serves = self._lifespan = None
        self.asgi_app = None
        # Objects in reference cycles (a model cache holding a method bound to the instance)
        # go with a collection; a replica on Ray froze what it held at start (settle_heap),
        # which no collection would reach.
        gc.unfreeze()
        gc.collect()

    # ------------------------------------------------------------------ requests

    async def serve(self, request: Request, sink: ResponseSink) -> None:
        """Serve one request over the channel, admitted by :meth:`admit`."""
        started = time.perf_counter()
        try:
            match request:
                case HTTPRequest():
                    out: ChannelResponse | ChannelSocket = ChannelResponse(request, sink)
                    trace = tracing.remote(request.trace, request.tracestate)
                    await self.serve_app(request.request_id, out.scope, out.receive, out, trace, started)
                case WebSocketOpen():
                    out = ChannelSocket(request, sink)
                    trace = tracing.remote(request.trace, request.tracestate)
                    await self.serve_app(request.request_id, out.scope, out.receive, out, trace, started)
                    sink.send(END)  # after the app's last message
                case MethodCall():
                    try:
                        await self._serve_call(request, sink)
                    finally:
                        self.served("call", request.method, started)
        finally:
            self.unserved()

    def served(self, kind: str, route: str, started: float) -> None:
        """A request of ``kind`` that ``started`` (perf_counter) ended: count it."""
        labels = (*self.labels, kind, route)
        replica_metrics.PROCESSING.observe(time.perf_counter() - started, *labels)  # and REQUESTS

    async def serve_app(
        self,
        request_id: str,
        scope: Scope,
        receive: Receive,
        out: HTTPOut | SocketOut,
        caller: tracing.TraceContext | None,
        started: float,
    ) -> None:
        """One HTTP request or WebSocket through the app, with the request's context, its
        answer going to ``out`` (the channel's, or the client itself on a connection this
        replica owns: direct ingress, its :meth:`slot` held by the caller); counted as it
        ends, from ``started`` (perf_counter), by the route its app matched ("" if
        cancelled). ``caller``: the span this replica's continues (None: the trace starts
        at the front, and nothing exported or named it); the span's ids are made only if
        something reads them, unless spans are exported. What fails around the app is
        answered as the app's own failure."""
        route = error = ""
        span = None
        method = scope.get("method", "WEBSOCKET")
        try:
            app = self.asgi_app
            if app is None:
                app = self.asgi_app = request_app(self._method("__call__"))
            trace: tracing.TraceContext | tracing.LazyTrace
            if tracing.exporting():
                trace, span = tracing.begin(f"{self.deployment} {method}", "server", caller)
                # The app's own instrumentation (FastAPI's spans) reads its parent from the
                # traceparent header, so the app sees this span's there (docs/observability.md).
                scope["headers"] = tracing.with_traceparent(scope.get("headers", []), trace)
            else:
                trace = tracing.LazyTrace(caller)
            serving = self._serves or self._serving()
            context = request_context.request_scope(
                request_id, trace, serving, scope["headers"], scope.get(API_KEY_SHARE)
            )
        except Exception as exc:  # noqa: BLE001 - answered as the app's own failure (run_app.py)
            # (Entering the context below only sets context variables: it does not fail.)
            app, context = failing_app(exc), contextlib.nullcontext()
        try:
            with context:
                state = self._lifespan.state if self._lifespan is not None else {}
                route = await run_app(app, scope, receive, out, request_id, state)
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            self.served(scope["type"], route, started)
            if span is not None:
                if route:
                    span.rename(f"{self.deployment} {method} {route}")
                    span.set("http.route", route)
                span.end(error)

    async def _serve_call(self, call: MethodCall, sink: ResponseSink) -> None:
        trace, span = tracing.begin(
            f"{self.deployment}.{call.method}", "server", tracing.remote(call.trace, call.tracestate)
        )
        error = ""
        serving = self._serving()
        with request_context.request_scope(call.request_id, trace, serving, call.model_id, call.share):
            try:
                await run_call(self._method(call.method), call, sink, str(self.deployment))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the caller gets it; the log has the traceback and id
                log_call_failure(exc, call, str(self.deployment))
                replica_metrics.ERRORS.inc(*self.labels, "call", call.method)
                error = type(exc).__name__
                sink.send(failure(exc, self._dumps))
            finally:
                if span is not None:
                    span.end(error)

    def enter_serving(self) -> None:
        """Give the current task (and what it starts) what this replica gives each request
        (see :func:`request_context.enter_serving`); only once it has started."""
        request_context.enter_serving(self._serving())

    def _serving(self) -> request_context.Serving:
        """What this replica gives each request (made once it has started)."""
        if self._serves is None:
            self._serves = request_context.Serving(
                self.context, self.instance, self.report_models, self.drain_signal, self._stop_hooks
            )
        return self._serves

    def _method(self, name: str) -> Callable[..., object]:
        return find_method(self.instance, self._definition, name, str(self.deployment))
