"""What the proxy relays of a replica's reply to an HTTP request: a complete response or
a head that HTTP can carry, and a body that keeps to the length its head declares.

The replica's app chose its status and headers, and a replica can break the channel's
order of answers; the proxy is a gateway and checks both before a byte reaches the
client. A reply that breaks them before anything went out is answered 502; a stream whose
body breaks them later is cut off (docs/http.md, "A replica's malformed reply"). Without
the check, uvicorn would refuse the head or the body in the middle of writing them (a
traceback in the proxy's log, and a connection closed with nothing, or a response whose
framing lies). Header names and values are held to uvicorn's rule (what it would
refuse), so a reply the proxied path relays is one direct ingress would write too; the
framing headers are held to HTTP's (one decimal ``content-length``, not beside a
``transfer-encoding``), which uvicorn would relay as the app wrote them.
"""

from __future__ import annotations

import re

from app_toolkit._runtime.messages import Answer, HTTPResponse, HTTPResponseStart

#: A content length as HTTP writes it (18 digits at most: what a 64-bit length holds).
_DIGITS = re.compile(rb"[0-9]{1,18}")
#: What uvicorn refuses in a response's header names and values (its HEADER_RE and
#: HEADER_VALUE_RE since 0.39; 0.38's name pattern has a misplaced bracket and refuses
#: nothing, so the rule is written here rather than read from it).
HEADER_RE = re.compile(rb'[\x00-\x1f\x7f()<>@,;:\[\]={} \t\\"]')
HEADER_VALUE_RE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
#: Statuses whose responses never have a body (RFC 9110 §15.3.5, §15.4.5).
_NO_BODY = frozenset({204, 304})


def checked(answer: Answer, method: str) -> BodyLength | str:
    """The body the replica's first answer to an HTTP request may carry after its head
    (what is left of it, for a stream), or why the answer cannot be relayed: it must be a
    complete response or a stream's head, with a valid head, and a complete response's
    body must be as long as its head declares."""
    if not isinstance(answer, HTTPResponse | HTTPResponseStart):
        return f"an HTTP request was answered with {type(answer).__name__}"
    declared = _plain_length(answer.status, answer.headers)
    if declared is None or not isinstance(answer.route, str):  # look closer
        fault = _head_fault(answer.status, answer.headers, answer.route)
        if fault is not None:
            return fault
        declared = next((int(v) for k, v in answer.headers if k.lower() == b"content-length"), -1)
    length = BodyLength.of(answer.status, declared, method)
    if isinstance(answer, HTTPResponse):
        return length.take(len(answer.body)) or length.end() or length
    return length


def _plain_length(status: object, headers: object) -> int | None:
    """The content length a head declares (-1: none) if the head is beyond doubt, which
    the usual one is, checked in one cheap pass; None when :func:`_head_fault` must look
    closer (it may still find nothing wrong)."""
    if type(status) is not int or not 200 <= status <= 599 or type(headers) is not list:
        return None
    declared = -1
    try:
        for name, value in headers:
            if not name or HEADER_RE.search(name) or HEADER_VALUE_RE.search(value):
                return None
            if len(name) == 14 and name.lower() == b"content-length":
                if declared >= 0 or _DIGITS.fullmatch(value) is None:
                    return None  # a second length, or not digits
                declared = int(value)
            elif len(name) == 17 and name.lower() == b"transfer-encoding":
                return None
    except (TypeError, ValueError):  # not pairs, or not bytes
        return None
    if declared > 0 and status in _NO_BODY:
        return None
    return declared


def _head_fault(status: object, headers: object, route: object) -> str | None:
    if type(status) is not int or not 200 <= status <= 599:
        return f"status {status!r} is not a final HTTP status"
    if not isinstance(route, str):
        return "its route is not text"
    if not isinstance(headers, list | tuple):
        return "its headers are not a list"
    lengths: set[bytes] = set()
    chunked = False
    for pair in headers:
        if not (isinstance(pair, tuple | list) and len(pair) == 2 and all(type(p) is bytes for p in pair)):
            return f"header {pair!r:.80} is not a pair of bytes"
        name, value = pair
        if not name or HEADER_RE.search(name):
            return f"header name {name!r:.80} is not one HTTP can carry"
        if HEADER_VALUE_RE.search(value):
            return f"header {name!r:.80} has a control character in its value"
        lowered = name.lower()
        if lowered == b"content-length":
            if not _DIGITS.fullmatch(value):
                return f"content-length {value!r:.80} is not a decimal number of at most 18 digits"
            lengths.add(value.lstrip(b"0") or b"0")
        elif lowered == b"transfer-encoding":
            chunked = True
    if len(lengths) > 1:
        return "it declares two content lengths"
    if lengths and chunked:
        return "it declares both a content length and a transfer encoding"
    if status in _NO_BODY and lengths - {b"0"}:
        return f"a {status} declares a body"
    return None


class BodyLength:
    """The body a relayed response may still carry: what its head declared (a
    ``content-length``; none for a 204 or 304), or any length (None) when it declared
    none or the request was a HEAD (whose body nobody writes)."""

    __slots__ = ("left",)

    def __init__(self, left: int | None) -> None:
        self.left = left

    @classmethod
    def of(cls, status: int, declared: int, method: str) -> BodyLength:
        """The length a head with ``status`` that declared ``declared`` bytes (-1: no
        length) lets its body have."""
        if method == "HEAD":
            return cls(None)
        if status in _NO_BODY:
            return cls(0)
        return cls(declared if declared >= 0 else None)

    def take(self, size: int) -> str | None:
        """``size`` more bytes of the body arrived: why they break the head, or None."""
        if self.left is None:
            return None
        if size > self.left:
            return "its body is longer than its head declares"
        self.left -= size
        return None

    def end(self) -> str | None:
        """The body ended: why that breaks the head, or None."""
        if self.left:
            return "its body is shorter than its head declares"
        return None
