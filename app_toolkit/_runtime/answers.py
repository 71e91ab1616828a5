"""The toolkit's own HTTP answers, each built in one place: a JSON body that carries the
request id, ``503`` with ``Retry-After`` for overload or a lost replica, and the generic
``500`` that never shows a traceback."""

from __future__ import annotations

import json

from starlette.types import Send

from app_toolkit._runtime.messages import HTTPResponse

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


def unavailable(why: str | None, request_id: str) -> HTTPResponse:
    """503 with Retry-After: overloaded, or no replica could serve the request."""
    detail = f"Service Unavailable: {why}" if why else "Service Unavailable"
    return json_answer(
        503,
        {"detail": detail, "request_id": request_id},
        request_id,
        ((b"retry-after", str(RETRY_AFTER_S).encode()),),
    )


def internal_error(request_id: str) -> HTTPResponse:
    """The generic 500: no traceback, just the id to find it in the replica log."""
    return error_answer(500, "Internal Server Error", request_id)
