"""What the request being served carries into the code it runs: its id, its span and the
multiplexed model it asks for. One object in one context variable, set once per request
(``request_context.request_scope``): read by log records, handle calls and
``tracing.current_trace``."""

from __future__ import annotations

from contextvars import ContextVar

#: Where a request names its multiplexed model: the id itself (handle calls), or an
#: HTTP/WebSocket scope's headers, read only if someone asks
#: (``request_context.current_model_id``).
ModelSource = str | list[tuple[bytes, bytes]]


class RequestValues:
    """The current request's id, span and model source. The span is a
    ``tracing.TraceContext``, a ``tracing.LazyTrace`` (its ids made when first read) or
    None; ``tracing.current_trace`` reads it (typed ``object`` here: tracing imports this
    module)."""

    __slots__ = ("request_id", "trace", "model")

    def __init__(self, request_id: str, trace: object, model: ModelSource) -> None:
        self.request_id = request_id
        self.trace = trace
        self.model = model


#: The request the current code serves (None outside one).
CURRENT: ContextVar[RequestValues | None] = ContextVar("app_toolkit_request", default=None)
