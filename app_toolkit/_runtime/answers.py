"""The toolkit's own HTTP answers, each built in one place: a JSON body that carries the
request id, ``503`` with ``Retry-After`` for overload or no replica to send to, ``502``
for a replica lost while it had the request or a malformed reply, and the generic
``500`` that never shows a traceback; and how a WebSocket whose app failed or returned
ends (its state by what the app sent, the messages that end it)."""

from __future__ import annotations

import json
import math
from http import HTTPStatus
from typing import Literal

from starlette.types import Message, Scope, Send

from app_toolkit._runtime.messages import (
    CLOSE_INTERNAL_ERROR,
    CLOSE_SERVICE_RESTART,
    RESTART_REASON,
    HTTPResponse,
)
from app_toolkit.exceptions import BackPressureError, ReplicaUnavailableError

REQUEST_ID_HEADER = b"x-request-id"
#: Seconds a client is asked to wait before retrying a 503.
RETRY_AFTER_S = 1


def header_dict(answer: HTTPResponse) -> dict[str, str]:
    """The headers as Starlette's ``Response(headers=...)`` takes them."""
    return {key.decode("latin-1"): value.decode("latin-1") for key, value in answer.headers}


async def send_answer(send: Send, answer: HTTPResponse) -> int:
    """Send ``answer`` as a whole ASGI response; returns its status."""
    await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
    await send({"type": "http.response.body", "body": answer.body})
    return answer.status


def json_answer(
    status: int, content: object, request_id: str, extra: tuple[tuple[bytes, bytes], ...] = ()
) -> HTTPResponse:
    body = json.dumps(content).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (REQUEST_ID_HEADER, request_id.encode()),
        *extra,
    ]
    return HTTPResponse(status, headers, body)


def error_answer(status: int, detail: str, request_id: str) -> HTTPResponse:
    """``{"detail": ..., "request_id": ...}`` with ``status``."""
    return json_answer(status, {"detail": detail, "request_id": request_id}, request_id)


def no_route(path: str, request_id: str) -> HTTPResponse:
    """404 for a path that no application (or operator page) serves, naming the path in
    Ray Serve's words (clients and tests of Ray Serve match that text)."""
    detail = f"Path '{path}' not found. Ping http://.../-/routes for available routes."
    return error_answer(404, detail, request_id)


def replica_lost(request_id: str) -> HTTPResponse:
    """502: the replica that had the request died; it may have run, so a client must not
    be told to simply send it again."""
    detail = "Bad Gateway: the replica was lost while it had the request; it may have run"
    return error_answer(502, detail, request_id)


def bad_reply(request_id: str) -> HTTPResponse:
    """502: the replica's reply broke HTTP or the channel's order (front/reply_check.py);
    the request may have run."""
    detail = "Bad Gateway: the replica sent a malformed reply; the request may have run"
    return error_answer(502, detail, request_id)


def unavailable(
    why: str | None, request_id: str, retry_after_s: float | None = RETRY_AFTER_S
) -> HTTPResponse:
    """503 with Retry-After: overloaded, or no replica could serve the request."""
    detail = f"Service unavailable: {why}" if why else "Service unavailable"
    return json_answer(
        503, {"detail": detail, "request_id": request_id}, request_id, _retry_after(retry_after_s)
    )


def overloaded(error: BackPressureError, request_id: str) -> HTTPResponse:
    """The answer to a request refused because its deployment's callers queue too many:
    503 (or 429) and Retry-After, as its ``backpressure_config`` says."""
    if error.status_code != 429:
        return unavailable("too many requests queued", request_id, error.retry_after_s)
    body = {"detail": "Too Many Requests: retry later", "request_id": request_id}
    return json_answer(429, body, request_id, _retry_after(error.retry_after_s))


def _retry_after(seconds: float | None) -> tuple[tuple[bytes, bytes], ...]:
    return () if seconds is None else ((b"retry-after", str(math.ceil(seconds)).encode()),)


#: The generic 500's body (Ray Serve's): nothing of the error, whose traceback is in the
#: replica's log under the request id the x-request-id header carries.
INTERNAL_ERROR_BODY = b"Internal Server Error"


def internal_error(request_id: str) -> HTTPResponse:
    """The generic 500: no traceback, just the id to find it in the replica log."""
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(INTERNAL_ERROR_BODY)).encode()),
        (REQUEST_ID_HEADER, request_id.encode()),
    ]
    return HTTPResponse(500, headers, INTERNAL_ERROR_BODY)


def for_failure(error: BaseException | None, request_id: str) -> HTTPResponse:
    """The answer to an app that raised ``error`` before its response: a downstream call
    refused for overload is overload here too (503 or 429 with Retry-After, as the refusing
    deployment's ``backpressure_config`` says), a downstream deployment with no replica a
    503; anything else the generic 500."""
    if isinstance(error, BackPressureError):
        return overloaded(error, request_id)
    if isinstance(error, ReplicaUnavailableError):
        return unavailable(None, request_id)
    return internal_error(request_id)


def escaped(error: BaseException | None, request_id: str) -> HTTPResponse:
    """The answer when ``error`` escaped the app before its response started (None: the
    app returned without one): :func:`for_failure`'s, and the connection closes after it,
    as uvicorn closes it."""
    return closing(for_failure(error, request_id))


def closing(answer: HTTPResponse) -> HTTPResponse:
    """``answer`` with ``connection: close``: the connection ends after it (lingering, if
    the request's body is still arriving: front/linger.py)."""
    return HTTPResponse(answer.status, [*answer.headers, (b"connection", b"close")], answer.body)


#: The ASGI extension that lets a WebSocket app answer its handshake with an HTTP response.
DENIAL_EXTENSION = "websocket.http.response"


def can_deny(scope: Scope) -> bool:
    """Whether the server of this WebSocket takes an HTTP response for its handshake."""
    return DENIAL_EXTENSION in (scope.get("extensions") or {})


def denial(answer: HTTPResponse) -> tuple[Message, Message]:
    """``answer`` as the two messages that refuse a WebSocket handshake with it."""
    start = {"type": "websocket.http.response.start", "status": answer.status, "headers": answer.headers}
    return start, {"type": "websocket.http.response.body", "body": answer.body}


#: Where a WebSocket stands, by what its app sent: nothing yet, accepted, a denial
#: response begun, or ended (closed, or denied whole): what follows is dropped.
HandshakeState = Literal["none", "accepted", "denying", "ended"]


def handshake_after(state: HandshakeState, message: Message) -> HandshakeState:
    """The socket's state once the app sent ``message``."""
    kind = message["type"]
    if ends_websocket(message):
        return "ended"
    if kind == "websocket.accept":
        return "accepted"
    if kind == "websocket.http.response.start":
        return "denying"
    return state


def ends_websocket(message: Message) -> bool:
    """Whether the app's ``message`` ends its WebSocket (a close, or a denial's last body
    piece): what follows is dropped."""
    kind = message["type"]
    return kind == "websocket.close" or (
        kind == "websocket.http.response.body" and not message.get("more_body", False)
    )


#: What ends a WebSocket still open at its replica's drain deadline, on every path: the
#: client reconnects (to another replica).
RESTART_CLOSE: Message = {"type": "websocket.close", "code": CLOSE_SERVICE_RESTART, "reason": RESTART_REASON}


def restart_end(state: HandshakeState) -> tuple[Message, ...]:
    """What ends a WebSocket at its replica's drain deadline: an accepted one closes with
    1012 (the client reconnects, to another replica); one not accepted yet, or whose
    denial is under way, or ended, gets nothing here (its app's own answer, or
    ``websocket_end`` when the app returns, ends it)."""
    return (dict(RESTART_CLOSE),) if state == "accepted" else ()


def websocket_end(state: HandshakeState, failed: bool, scope: Scope, request_id: str) -> tuple[Message, ...]:
    """What ends a WebSocket whose app raised (``failed``) or returned without closing it.
    No handshake sent: the generic 500 as its answer, as uvicorn answers both. Accepted:
    a close frame, 1011 if the app raised (uvicorn drops the connection without one:
    docs/http.md says why this differs), else 1000. A denial response begun: its end.
    Ended already: nothing."""
    if state == "ended":
        return ()
    if state == "denying":
        return ({"type": "websocket.http.response.body", "body": b""},)
    if state == "none" and can_deny(scope):
        return denial(internal_error(request_id))
    return ({"type": "websocket.close", "code": CLOSE_INTERNAL_ERROR if failed else 1000, "reason": ""},)


def as_bytes(answer: HTTPResponse) -> bytes:
    """``answer`` as HTTP/1.1 bytes that close the connection: for a connection written
    to outside ASGI (a refusal before a request is parsed, or one taken back from a dead
    replica)."""
    try:
        reason = HTTPStatus(answer.status).phrase
    except ValueError:
        reason = ""
    lines = [f"HTTP/1.1 {answer.status} {reason}".encode()]
    lines += [name + b": " + value for name, value in answer.headers if name != b"connection"]
    lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + answer.body
