"""The fuzzer's app, the same on every server: it answers each HTTP request with what it
saw (method, path, headers, body) as JSON, and echoes a WebSocket's first message.

Served by uvicorn as ``tests.fuzz.echo_app:app`` and by the toolkit through
:func:`deployments`, on both of its paths.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

import app_toolkit as tk

#: A body larger than this is not read further (the fuzzer's bodies are small).
MAX_BODY = 1 << 20
#: Where the toolkit serves the copy that keeps the proxied path (the other is at "/").
PROXIED_PREFIX = "/proxied"


def _text(data: bytes) -> str:
    return data.decode("latin-1")


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
    elif scope["type"] == "http":
        await _http(scope, receive, send)
    elif scope["type"] == "websocket":
        global _serving
        _serving += 1
        try:
            await _websocket(scope, receive, send)
        finally:
            _serving -= 1


#: Requests this process's app is serving now, answered at ``INFLIGHT_PATH`` (under either
#: prefix): a request the client has left must not stay here (a hang).
_serving = 0
INFLIGHT_PATH = "/__inflight"


async def _http(scope: Scope, receive: Receive, send: Send) -> None:
    global _serving
    if scope["path"].endswith(INFLIGHT_PATH):
        await _answer(send, str(_serving).encode())
        return
    _serving += 1
    try:
        await _echo(scope, receive, send)
    finally:
        _serving -= 1


async def _answer(send: Send, answer: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


async def _echo(scope: Scope, receive: Receive, send: Send) -> None:
    body, more = b"", True
    while more and len(body) <= MAX_BODY:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        more = message.get("more_body", False)
    seen: dict[str, Any] = {
        "method": scope["method"],
        "http_version": scope["http_version"],
        "path": scope["path"],
        "raw_path": _text(scope.get("raw_path") or b""),
        "query_string": _text(scope["query_string"]),
        "headers": [[_text(name), _text(value)] for name, value in scope["headers"]],
        "body": _text(body),
    }
    await _answer(send, json.dumps(seen).encode())


async def _websocket(scope: Scope, receive: Receive, send: Send) -> None:
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    message = await receive()
    if message["type"] == "websocket.receive":
        await send(
            {"type": "websocket.send", "text": message.get("text") or _text(message.get("bytes") or b"")}
        )
        await send({"type": "websocket.close", "code": 1000})


def _built() -> ASGIApp:
    """The app, from a builder (``tk.ingress`` takes a plain function as one)."""
    return app


@tk.deployment(num_replicas=1, direct_ingress=True)
@tk.ingress(_built)
class DirectEcho:
    """The echo app on direct ingress: the replica owns the client's connection."""


@tk.deployment(num_replicas=1, direct_ingress=False)
@tk.ingress(_built)
class ProxiedEcho:
    """The echo app on the proxied path: the proxy relays over the channel."""
