"""W3C trace context for your code: the span of the request being served.

Each replica that works on a request (the ingress, then every deployment a handle call
reaches) runs as a new span of the request's trace. :func:`current_trace` names it, to
log it or to send ``current_trace().traceparent`` on to services your code calls
(``docs/observability.md``).
"""

from app_toolkit._runtime.tracing import TraceContext, current_trace

__all__ = ["TraceContext", "current_trace"]
