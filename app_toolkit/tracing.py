"""W3C trace context through the toolkit: ``traceparent`` and ``tracestate``.

The proxy keeps a request's valid ``traceparent`` header, or starts a trace by adding
one. Each replica that works on the request — the ingress, then every deployment a
handle call reaches — runs as a new span of that trace, whose parent is its caller's
span. User code reads it with :func:`current_trace` (to log it, or to send
``current_trace().traceparent`` on to services it calls).
"""

from __future__ import annotations

import random
import re
from contextvars import ContextVar, Token
from dataclasses import dataclass

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


_current: ContextVar[TraceContext | None] = ContextVar("app_toolkit_trace", default=None)


def current_trace() -> TraceContext | None:
    """The span of the request being served (None outside a request)."""
    return _current.get()


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
    return TraceContext(f"{random.getrandbits(128) or 1:032x}", _span_id(), "")


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


def enter(trace: TraceContext) -> Token[TraceContext | None]:
    """Run the current task (and what it calls) in ``trace`` until :func:`leave`."""
    return _current.set(trace)


def leave(token: Token[TraceContext | None]) -> None:
    _current.reset(token)


def from_headers(headers: list[tuple[bytes, bytes]]) -> tuple[str, str]:
    """(traceparent, tracestate) from ASGI headers ("" for a missing one)."""
    parent = state = ""
    for key, value in headers:
        if key == TRACEPARENT_HEADER:
            parent = value.decode("latin-1")
        elif key == TRACESTATE_HEADER:
            state = value.decode("latin-1")
    return parent, state


def with_traceparent(headers: list[tuple[bytes, bytes]], trace: TraceContext) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``trace`` as the traceparent (the app then sees its own span as
    the parent of what it does)."""
    kept = [item for item in headers if item[0] != TRACEPARENT_HEADER]
    return [*kept, (TRACEPARENT_HEADER, trace.traceparent.encode())]
