"""What the front reads from a request and what it forwards: the request id (made here
when the client sent none), the deadline header, and the scope the replica sees (HTTP and
WebSocket alike): the client's headers as sent, unless ``HTTPOptions.request_id_headers``
adds the ids. No I/O: functions of the scope and the options."""

from __future__ import annotations

import random
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

from starlette.types import Scope

from app_toolkit._runtime import tracing
from app_toolkit._runtime.answers import REQUEST_ID_HEADER
from app_toolkit._runtime.front.path_match import AppMatcher
from app_toolkit._runtime.request_keys import KEY_HEADERS, SHARD_KEY_HEADER, KeyHeaders, routing_key
from app_toolkit._runtime.request_values import API_KEY_SHARE
from app_toolkit.config.api_keys import API_KEY_HEADER, AUTHORIZATION_HEADER

#: The scope key that names the API key a request presented (``app_toolkit.api_key_name``).
API_KEY_NAME = "app_toolkit.api_key"
#: Set (True) in the scope when that key has a tokens limit: its tokens are charged
#: (``app_toolkit.charge_tokens``), and not otherwise.
API_KEY_METERED = "app_toolkit.api_key_metered"
#: The scope key with ``sha256:<hex>`` of the certificate the client presented on the
#: request's TLS connection (verified by the handshake; ``https.client_cert_of``), if any.
CLIENT_CERT = "app_toolkit.client_cert"

_FORWARDED_KEYS = (
    "type",
    "asgi",
    "http_version",
    "method",
    "scheme",
    "path",
    "raw_path",
    "root_path",
    "query_string",
    "headers",
    "client",
    "server",
    "subprotocols",
    "extensions",
    API_KEY_NAME,
    API_KEY_METERED,
    API_KEY_SHARE,
)

TIMEOUT_HEADER = b"x-request-timeout-seconds"


def new_request_id() -> str:
    """A request id for a request whose client sent none: 32 hex digits."""
    return f"{random.getrandbits(128):032x}"


@dataclass(slots=True)  # not frozen: made for every request, and a frozen init costs twice
class RequestHeaders:
    """What the proxy reads from a request's headers, in one pass (read-only)."""

    request_id: str
    client_id_used: bool  # the client's own x-request-id is kept
    timeout: bytes | None
    content_length: bytes | None
    model_id: str = ""  # the multiplexed model it asks for
    caller: tracing.TraceContext | None = None  # the client's span, from a valid traceparent
    #: The key of the replica it should go to: its shard key, else its session id
    #: (``request_keys.routing_key``); "" for none.
    shard_key: str = ""
    #: It declares a body (a content-length other than 0, or a transfer-encoding); an
    #: HTTP/1.1 request without either has none, and nothing needs to be read.
    has_body: bool = True
    #: It has an x-request-id, traceparent or tracestate header, valid or not (one the
    #: proxy may have to replace in what it forwards).
    names_ids: bool = True
    #: Its ``Authorization`` and ``X-API-Key`` values (``key_check`` reads a key from them);
    #: ``b""`` for one sent twice.
    authorization: bytes | None = None
    api_key: bytes | None = None

    @property
    def traced(self) -> bool:
        """It carries a valid W3C traceparent."""
        return self.caller is not None


#: The headers :func:`read_headers` reads (besides the shard key's, which is configurable).
_READ = frozenset(
    {
        REQUEST_ID_HEADER,
        TIMEOUT_HEADER,
        b"content-length",
        b"transfer-encoding",
        AUTHORIZATION_HEADER,
        API_KEY_HEADER,
        tracing.TRACEPARENT_HEADER,
        tracing.TRACESTATE_HEADER,
        *KEY_HEADERS,
    }
)


def read_headers(scope: Scope, shard_header: bytes = SHARD_KEY_HEADER) -> RequestHeaders:
    request_id = timeout = content_length = authorization = api_key = None
    parent = state = shard_key = ""
    keys: KeyHeaders | None = None  # made when a request names a model or session
    chunked = names_ids = False
    for key, value in scope["headers"]:
        if key not in _READ and key != shard_header:
            continue  # most headers: one set lookup instead of eight comparisons
        if key == shard_header:  # first: it may be configured to a name read below
            shard_key = value.decode("latin-1")
        elif key == REQUEST_ID_HEADER:
            names_ids = True
            text = value.decode("latin-1")
            if 0 < len(text) <= 200 and text.isascii() and text.isprintable():  # it goes into logs
                request_id = text
        elif key == TIMEOUT_HEADER:
            timeout = value
        elif key == b"content-length":
            content_length = value
        elif key == b"transfer-encoding":
            chunked = True
        elif key in KEY_HEADERS:
            keys = keys or KeyHeaders()
            keys.add(key, value)
        # The key headers as config/api_keys.key_headers reads them (sent twice: no key; the
        # app may read either line), here in the one pass over the headers.
        elif key == AUTHORIZATION_HEADER:
            authorization = value if authorization is None else b""
        elif key == API_KEY_HEADER:
            api_key = value if api_key is None else b""
        elif key == tracing.TRACEPARENT_HEADER:
            parent = value.decode("latin-1")
            names_ids = True
        elif key == tracing.TRACESTATE_HEADER:  # several lines make one list (W3C)
            text = value.decode("latin-1")
            state = f"{state},{text}" if state else text
            names_ids = True
    caller = tracing.remote(parent, state) if parent else None
    return RequestHeaders(
        request_id or new_request_id(),
        request_id is not None,
        timeout,
        content_length,
        keys.model_id if keys is not None else "",
        caller,
        routing_key(shard_key, keys.session_id) if keys is not None else shard_key,
        chunked or (content_length is not None and content_length != b"0"),
        names_ids,
        authorization,
        api_key,
    )


def parse_timeout(value: bytes | None) -> float | None | str:
    """The request's deadline: seconds, None, or an error message."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 86_400:
        return (
            "x-request-timeout-seconds must be a number of seconds between 0 and "
            f"86400, got {value.decode('latin-1')!r}"
        )
    return seconds


def request_deadline(header: bytes | None, *limits: float | None) -> float | None | str:
    """The request's deadline in seconds: the least of its header's and ``limits`` (its
    route's, ``request_timeout_s``; None: none); a header that is not a number: why."""
    timeout_s = parse_timeout(header) if header is not None else None
    if isinstance(timeout_s, str):
        return timeout_s
    for limit in limits:
        if limit is not None and (timeout_s is None or limit < timeout_s):
            timeout_s = limit
    return timeout_s


def forwarded_copy(scope: Scope) -> dict[str, Any]:
    """The keys of ``scope`` a replica gets over the channel (a copy: the server's own
    scope is left as it is); :func:`forward_in_place` then makes it what the replica sees."""
    return {key: scope[key] for key in _FORWARDED_KEYS if key in scope}


def forward_in_place(
    scope: MutableMapping[str, Any],
    route: AppMatcher,
    headers: RequestHeaders,
    proxy_span: tracing.TraceContext | None,
    *,
    id_headers: bool,
) -> tracing.TraceContext | None:
    """Make ``scope`` the scope the replica sees (a :func:`forwarded_copy`, or the server's
    own when the app runs in this process: direct ingress): the path kept whole, the
    prefix added to root_path, the headers as the client sent them. Returns the trace the
    replica's span continues: the proxy's own span when it exports one (``proxy_span``),
    else the client's, else one started here — None when nothing names it yet (made where
    it is read: ``tracing.LazyTrace``, or ``tracing.new_trace`` to send it on). It travels
    beside the scope, as the request id does. ``id_headers``
    (``HTTPOptions.request_id_headers``): the headers also name the request id and trace,
    as a proxy that adds them would."""
    scope["root_path"] = scope.get("root_path", "") + (
        "" if route.route_prefix == "/" else route.route_prefix
    )
    started = proxy_span is None and headers.caller is None  # the trace starts here
    trace = proxy_span or headers.caller
    if id_headers and (not headers.client_id_used or started or proxy_span is not None):
        replaced = {REQUEST_ID_HEADER} if not headers.client_id_used else set()
        added = [] if headers.client_id_used else [(REQUEST_ID_HEADER, headers.request_id.encode())]
        if proxy_span is not None:
            replaced.add(tracing.TRACEPARENT_HEADER)
            added.append((tracing.TRACEPARENT_HEADER, proxy_span.traceparent.encode()))
        elif started:  # an invalid traceparent voids its tracestate too (W3C)
            replaced |= {tracing.TRACEPARENT_HEADER, tracing.TRACESTATE_HEADER}
            trace = tracing.new_trace()  # named here: the replica's span is its child
            added.append((tracing.TRACEPARENT_HEADER, trace.traceparent.encode()))
        if proxy_span is not None and not headers.traced:
            replaced.add(tracing.TRACESTATE_HEADER)
        if headers.names_ids:
            scope["headers"] = [*(item for item in scope["headers"] if item[0] not in replaced), *added]
        else:  # nothing to replace (most requests): the headers as they are, and ours
            scope["headers"] = [*scope["headers"], *added]
    return trace


def with_request_id(headers: Iterable[tuple[bytes, bytes]], request_id: str) -> list[tuple[bytes, bytes]]:
    """A response's ``headers`` as a new list, with ``x-request-id`` added unless the app
    set it."""
    answered = list(headers)
    for key, _ in answered:
        if key.lower() == REQUEST_ID_HEADER:
            return answered
    answered.append((REQUEST_ID_HEADER, request_id.encode()))
    return answered
