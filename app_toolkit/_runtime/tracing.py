"""Tracing through the toolkit: W3C trace context, and OpenTelemetry spans when asked.

Trace context: the proxy continues a request's valid ``traceparent`` header, or starts a
trace; the trace travels to the replica beside the request (not in its headers). Each
replica that works on the request (the ingress, then every deployment a handle call
reaches) runs as a new span of that trace, whose parent is its caller's span; user code
reads it with ``app_toolkit.tracing.current_trace()``.

OpenTelemetry spans for the toolkit's hops (the proxy's request, each replica's work,
each handle call) are made only when OpenTelemetry is installed *and* a tracer provider
has been set in the process (by the application, or by the function
``APP_TOOLKIT_OTEL_SETUP`` names, which every toolkit process calls at start). Otherwise
every span function returns at once and nothing is allocated. A span's ids are the ids
the toolkit propagates, so ``current_trace()`` names the exported span.
"""

from __future__ import annotations

import logging
import os
import random
import re
import threading
import time
from contextvars import Token
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypedDict

from app_toolkit._runtime import request_values
from app_toolkit.exceptions import ConfigError

try:
    from opentelemetry import context as _context
    from opentelemetry import trace as _api
    from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
    from opentelemetry.trace.span import TraceState
except ImportError:  # the optional extra is not installed: no spans, no cost
    _api = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span as _OtelSpan
    from opentelemetry.trace import Tracer

#: version 00: trace id (32 hex), parent span id (16 hex), flags (2 hex).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
TRACEPARENT_HEADER = b"traceparent"
TRACESTATE_HEADER = b"tracestate"


@dataclass(frozen=True, slots=True)
class TraceContext:
    """The span the current code runs in."""

    trace_id: str  # 32 hex digits, the same for every span of the request
    span_id: str  # 16 hex digits, this span
    parent_id: str  # the caller's span ("" when this span started the trace)
    flags: str = "01"  # sampled
    state: str = ""  # tracestate, passed on unchanged

    @property
    def traceparent(self) -> str:
        """The header value that makes a callee's span a child of this one."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


class LazyTrace:
    """The span of a request served in this process, its ids made when first read (most
    requests' never are): a child of ``parent``, or when None, of a span the front started
    for the request and exported nothing for (so the trace starts at the front, as when
    the request was forwarded: :func:`new_trace` there, :func:`child` here)."""

    __slots__ = ("_parent", "_made")

    def __init__(self, parent: TraceContext | None) -> None:
        self._parent = parent
        self._made: TraceContext | None = None

    def read(self) -> TraceContext:
        made = self._made
        if made is None:
            # Threads the request's context was copied to (a sync endpoint's) share this
            # object: the first read is made once, whichever thread reads first.
            with _first_read:
                made = self._made
                if made is None:
                    parent = self._parent
                    made = self._made = child(parent if parent is not None else new_trace())
        return made


_first_read = threading.Lock()


def current_trace() -> TraceContext | None:
    """The span of the request being served (None outside a request): its
    ``request_values``, set for each request by ``request_context.request_scope``."""
    values = request_values.CURRENT.get()
    found = values.trace if values is not None else None
    if isinstance(found, LazyTrace):
        return found.read()
    return found if isinstance(found, TraceContext) else None


def parse(traceparent: str) -> tuple[str, str, str] | None:
    """(trace id, parent span id, flags) of a valid ``traceparent``; None if invalid."""
    found = _TRACEPARENT.fullmatch(traceparent.strip())
    if found is None:
        return None
    version, trace_id, parent_id, flags, rest = found.groups()
    if version == "ff" or (version == "00" and rest) or set(trace_id) == {"0"} or set(parent_id) == {"0"}:
        return None
    return trace_id, parent_id, flags


def _span_id() -> str:
    # Random, not secret: trace ids only need to be unique (and are cheap to make).
    return f"{random.getrandbits(64) or 1:016x}"


def new_trace() -> TraceContext:
    """The first span of a new trace."""
    ids = f"{random.getrandbits(192):048x}"  # both ids from one draw
    trace_id, span_id = ids[:32], ids[32:]
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:  # W3C: all zeros is invalid
        return new_trace()
    return TraceContext(trace_id, span_id, "")


_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


def remote(traceparent: str, tracestate: str = "") -> TraceContext | None:
    """The caller's span as its ``traceparent`` names it (None if it is not valid)."""
    parsed = parse(traceparent) if traceparent else None
    if parsed is None:
        return None
    trace_id, span_id, flags = parsed
    return TraceContext(trace_id, span_id, "", flags, tracestate)


def child(parent: TraceContext | None) -> TraceContext:
    """A new span whose parent is ``parent`` (a new trace when None)."""
    if parent is None:
        return new_trace()
    return TraceContext(parent.trace_id, _span_id(), parent.span_id, parent.flags, parent.state)


def child_of(traceparent: str, tracestate: str = "") -> TraceContext:
    """A new span whose parent is ``traceparent``'s (a new trace if it is not valid)."""
    return child(remote(traceparent, tracestate))


def with_traceparent(headers: list[tuple[bytes, bytes]], trace: TraceContext) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``trace`` as the traceparent and its tracestate (the app then
    sees its own span as the parent of what it does; a tracestate the client sent with an
    invalid traceparent goes with it, as W3C asks)."""
    kept = [item for item in headers if item[0] not in (TRACEPARENT_HEADER, TRACESTATE_HEADER)]
    state = [(TRACESTATE_HEADER, trace.state.encode())] if trace.state else []
    return [*kept, (TRACEPARENT_HEADER, trace.traceparent.encode()), *state]


# ------------------------------------------------------------------------ OpenTelemetry

logger = logging.getLogger("app_toolkit.tracing")

#: The import path (``module:function`` or ``module.function``) of a function to call once
#: in every toolkit process to set a tracer provider.
SETUP_ENV = "APP_TOOLKIT_OTEL_SETUP"
_INSTRUMENTATION = "app_toolkit"

Kind = Literal["server", "client"]
_RECHECK_S = 1.0


class _State(TypedDict):
    tracer: Tracer | None
    setup_done: bool
    next_check: float


_state: _State = {"tracer": None, "setup_done": False, "next_check": 0.0}


def _tracer() -> Tracer | None:
    """The toolkit's tracer once a real provider is set; None before. Looking up the
    provider costs about a microsecond, so without one it is looked up at most once a
    second (a provider set later makes spans from then on)."""
    tracer = _state["tracer"]
    if tracer is not None or _api is None:
        return tracer
    now = time.monotonic()
    if now < _state["next_check"]:
        return None
    _state["next_check"] = now + _RECHECK_S
    provider = _api.get_tracer_provider()
    if isinstance(provider, _api.ProxyTracerProvider | _api.NoOpTracerProvider):
        return None  # nobody configured OpenTelemetry in this process
    tracer = _state["tracer"] = provider.get_tracer(_INSTRUMENTATION)
    return tracer


def exporting() -> bool:
    """Spans are being made (a tracer provider is set): only then is a span's name worth
    building (it is, on every request)."""
    if _state["tracer"] is not None:
        return True
    if _api is None or time.monotonic() < _state["next_check"]:
        return False  # what _tracer() would say, without the call (asked twice a request)
    return _tracer() is not None


class Span:
    """One exported span and the trace context the toolkit propagates for it."""

    __slots__ = ("_span", "_token", "trace")

    def __init__(self, span: _OtelSpan, trace: TraceContext) -> None:
        self._span = span
        self._token: Token[Context] | None = None
        self.trace = trace

    def activate(self) -> None:
        """Make it OpenTelemetry's current span in this task, so the spans user code
        makes are its children (until :meth:`end`, which must run in the same task)."""
        self._token = _context.attach(_api.set_span_in_context(self._span))

    def rename(self, name: str) -> None:
        self._span.update_name(name)

    def set(self, key: str, value: str | int) -> None:
        self._span.set_attribute(key, value)

    def end(self, error: str = "") -> None:
        if self._token is not None:
            _context.detach(self._token)
            self._token = None
        if error:
            self._span.set_status(Status(StatusCode.ERROR, error))
        self._span.end()


def start(name: str, kind: Kind, parent: TraceContext | None) -> Span | None:
    """A new span, child of ``parent``'s span (its span_id), or when None of
    OpenTelemetry's current span (a new trace if there is none). None when no tracer
    provider is set."""
    tracer = _tracer()
    if tracer is None:
        return None
    context = None
    state = ""
    if parent is not None:
        state = parent.state
        remote = SpanContext(
            int(parent.trace_id, 16),
            int(parent.span_id, 16),
            is_remote=True,
            trace_flags=TraceFlags(int(parent.flags, 16)),
            trace_state=TraceState.from_header([state]) if state else None,
        )
        context = _api.set_span_in_context(NonRecordingSpan(remote))
    span = tracer.start_span(
        name, context=context, kind=SpanKind.SERVER if kind == "server" else SpanKind.CLIENT
    )
    made = span.get_span_context()
    parent_id = parent.span_id if parent is not None else ""
    if parent is None:  # a child of OpenTelemetry's current span, if there is one
        above = getattr(span, "parent", None)
        parent_id = f"{above.span_id:016x}" if above is not None else ""
        state = made.trace_state.to_header() if made.trace_state else ""
    trace = TraceContext(
        f"{made.trace_id:032x}", f"{made.span_id:016x}", parent_id, f"{int(made.trace_flags):02x}", state
    )
    return Span(span, trace)


def begin(name: str, kind: Kind, parent: TraceContext | None) -> tuple[TraceContext, Span | None]:
    """The trace context for a new hop below ``parent``, and its exported span if spans
    are being made (else None, and the context's ids are the toolkit's own). A server
    span is OpenTelemetry's current span until it ends."""
    span = start(name, kind, parent)
    if span is None:
        return child(parent), None
    if kind == "server":
        span.activate()
    return span.trace, span


def setup_from_env() -> None:
    """Call the function ``APP_TOOLKIT_OTEL_SETUP`` names, once per process. Raises
    ConfigError (with what to fix) when it cannot be imported or OpenTelemetry is missing."""
    path = os.environ.get(SETUP_ENV, "")
    if not path or _state["setup_done"]:
        return
    _state["setup_done"] = True
    if _api is None:
        raise ConfigError(
            f"{SETUP_ENV} is set, but OpenTelemetry is not installed: "
            "pip install 'app_toolkit[opentelemetry]' (or unset the variable)"
        )
    from app_toolkit.import_path import import_attr

    setup = import_attr(path)
    if not callable(setup):
        raise ConfigError(f'{SETUP_ENV}="{path}" must name a function that sets a tracer provider')
    setup()
    _state["next_check"] = 0.0
    if _tracer() is None:
        logger.warning("%s=%s ran but set no tracer provider: no spans are exported", SETUP_ENV, path)


def client_span(name: str) -> tuple[TraceContext | None, Span | None]:
    """For a handle call: the span the callee is to be a child of. That is the current
    trace, or with spans on, a new client span (which the call ends) below
    OpenTelemetry's current span: the replica's, or one user code opened inside it."""
    span = start(name, "client", None)
    return (span.trace if span is not None else current_trace()), span
