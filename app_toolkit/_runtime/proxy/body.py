"""Reading a request body in the proxy, within three bounds: its own size
(``max_request_body_bytes``, 413), the bytes of all bodies the proxy holds at once
(``max_buffered_body_bytes``, 503 with Retry-After) and the longest pause between two of its
pieces (``body_timeout_s``, 408)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.types import Receive

from app_toolkit._runtime.answers import error_answer, unavailable
from app_toolkit._runtime.messages import HTTPResponse
from app_toolkit.config import HTTPOptions

CLIENT_CLOSED = 499  # nginx's status for "the client closed the connection"


class BodyBudget:
    """Bytes of request bodies one proxy holds at once (read, queued or being sent)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size


@dataclass(slots=True)
class Body:
    """A request body as read: ``data`` when whole, else why not (``refusal``)."""

    data: bytes = b""
    held: int = 0  # bytes taken from the budget; give them back when the request ends
    refusal: int = 0  # 0: the whole body is here; else 413, 503, 408 or CLIENT_CLOSED

    def answer(self, http: HTTPOptions, request_id: str) -> HTTPResponse:
        """The answer to a refused body (not for CLIENT_CLOSED: nobody is listening)."""
        return refusal_answer(self.refusal, http, request_id)


def refusal_answer(status: int, http: HTTPOptions, request_id: str) -> HTTPResponse:
    """The answer to a body refused with ``status``: 413 (too large), 503 (too many
    bodies held) or 408 (it stalled)."""
    if status == 413:
        detail = f"Request body larger than {http.max_request_body_bytes} bytes (max_request_body_bytes)"
        return error_answer(413, detail, request_id)
    if status == 503:
        return unavailable("too many request bodies in flight", request_id)
    detail = f"The request body stalled for over {http.body_timeout_s} s (body_timeout_s)"
    return error_answer(408, detail, request_id)


async def read_body(
    receive: Receive, content_length: bytes | None, http: HTTPOptions, budget: BodyBudget
) -> Body:
    """Read the whole body, taking its bytes from ``budget`` (up front when the length is
    declared, else as they arrive)."""
    body = Body()
    limit = http.max_request_body_bytes
    if content_length is not None and content_length.isdigit():
        declared = int(content_length)
        if declared > limit:
            body.refusal = 413
            return body
        if not budget.take(declared):
            body.refusal = 503
            return body
        body.held = declared
    chunks = []
    size = 0
    while True:
        try:
            async with asyncio.timeout(http.body_timeout_s):
                message = await receive()
        except TimeoutError:
            body.refusal = 408
            return body
        if message["type"] == "http.disconnect":
            body.refusal = CLIENT_CLOSED
            return body
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            body.refusal = 413
            return body
        if size > body.held:  # more than declared, or no length declared
            if not budget.take(size - body.held):
                body.refusal = 503
                return body
            body.held = size
        chunks.append(chunk)
        if not message.get("more_body", False):
            body.data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            return body
