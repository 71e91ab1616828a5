"""OpenTelemetry spans for the toolkit's hops: the proxy's request, each replica's work,
each handle call.

Spans are made only when OpenTelemetry is installed *and* a tracer provider has been
set in the process (by the application, or by the function ``APP_TOOLKIT_OTEL_SETUP``
names, which every toolkit process calls at start). Otherwise every function here
returns at once and nothing is allocated. A span's ids are the ids the toolkit
propagates (:mod:`app_toolkit.tracing`), so ``current_trace()`` names the exported span.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Literal

from app_toolkit import tracing
from app_toolkit.exceptions import ConfigError
from app_toolkit.tracing import TraceContext

try:
    from opentelemetry import context as _context
    from opentelemetry import trace as _api
    from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
    from opentelemetry.trace.span import TraceState
except ImportError:  # the optional extra is not installed: no spans, no cost
    _api = None  # type: ignore[assignment]

logger = logging.getLogger("app_toolkit.tracing")

#: ``module:function`` to call once in every toolkit process to set a tracer provider.
SETUP_ENV = "APP_TOOLKIT_OTEL_SETUP"
_INSTRUMENTATION = "app_toolkit"

Kind = Literal["server", "client"]
_RECHECK_S = 1.0
_state: dict[str, Any] = {"tracer": None, "setup_done": False, "next_check": 0.0}


def _tracer() -> Any:
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


class Span:
    """One exported span and the trace context the toolkit propagates for it."""

    __slots__ = ("_span", "_token", "trace")

    def __init__(self, span: Any, trace: TraceContext) -> None:
        self._span = span
        self._token: Any = None
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
        return tracing.child(parent), None
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
