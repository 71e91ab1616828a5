"""What the request being served carries into the code it runs: its id, its span, the
multiplexed model it asks for and its API key's share. One object in one context variable,
set once per request (``request_context.request_scope``): read by log records, handle
calls and ``tracing.current_trace``."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

from app_toolkit._runtime.compact import compact


@compact
@dataclass(frozen=True, slots=True)
class Share:
    """What a request's API key gives it in a saturated deployment's queue
    (``waiting_line.py``): ``key``, the key's name; ``weight``, its share against other
    keys' (1 unless the key says); ``priority``, its class (lower first; 0 unless the key
    says), also vLLM's request ``priority``. Travels with the request's handle calls."""

    key: str
    weight: float = 1.0
    priority: int = 0


#: Where a request names its multiplexed model: the id itself (handle calls), or an
#: HTTP/WebSocket scope's headers, read only if someone asks
#: (``request_context.current_model_id``).
ModelSource = str | list[tuple[bytes, bytes]]


#: The scope key with the :class:`Share` of the API key a request presented (the front
#: puts it there; the replica serving the request reads it).
API_KEY_SHARE = "app_toolkit.api_key_share"


class RequestValues:
    """The current request's id, span, model source and share (None: no API key). The
    span is a ``tracing.TraceContext``, a ``tracing.LazyTrace`` (its ids made when first
    read) or None; ``tracing.current_trace`` reads it (typed ``object`` here: tracing
    imports this module). ``leave``: what gives back the concurrent slot of the key an
    open route let the request in as (``front/key_door.py``), called as its scope ends."""

    __slots__ = ("request_id", "trace", "model", "share", "leave")

    def __init__(
        self, request_id: str, trace: object, model: ModelSource, share: Share | None = None
    ) -> None:
        self.request_id = request_id
        self.trace = trace
        self.model = model
        self.share = share
        self.leave: Callable[[], None] | None = None


#: The request the current code serves (None outside one).
CURRENT: ContextVar[RequestValues | None] = ContextVar("app_toolkit_request", default=None)
