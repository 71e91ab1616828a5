"""The channel's frames for requests: what the proxy sends is what the replica reads."""

from __future__ import annotations

import pickle

import pytest

from app_toolkit._runtime.channel.frames import decode_request, encode_request
from app_toolkit._runtime.messages import HTTPRequest, Request, WebSocketOpen

_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    "request_",
    [
        HTTPRequest("rid", {"type": "http", "headers": [(b"a", b"b")]}, b"body", True, _PARENT, "k=v"),
        HTTPRequest("rid", {"type": "http"}, b""),
        WebSocketOpen("wid", {"type": "websocket"}, _PARENT, "k=v"),
    ],
    ids=["http-traced", "http", "websocket"],
)
def test_a_request_and_its_trace_arrive_as_sent(request_: Request) -> None:
    kind, parts = encode_request(request_, pickle.dumps)
    assert decode_request(kind, memoryview(b"".join(parts))) == request_
