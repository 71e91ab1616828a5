"""Drive an ASGI app on a data plane's loop from a blocking caller's thread.

:class:`InProcessTransport` is an httpx transport whose responses stream: the status
and headers arrive as soon as the app sends them, and the body is read chunk by chunk
while the app is still producing it (SSE line by line). Closing the response early is a
client disconnect: the app's ``receive()`` returns ``http.disconnect``.
:class:`WebSocketSession` is the same for a WebSocket. Both keep at most
``MAX_BUFFERED`` unread messages from the app; the app waits when the reader falls behind.
"""

from __future__ import annotations

import asyncio
import json
import queue
from collections.abc import Iterator
from typing import Any

import httpx
from starlette.types import ASGIApp, Message, Scope
from starlette.websockets import WebSocketDisconnect

from app_toolkit._runtime.answers import DENIAL_EXTENSION
from app_toolkit._runtime.routing.data_plane import DataPlane, Pending

MAX_BUFFERED = 64
CLOSE_GRACE_S = 5.0  # how long an app may take to notice a disconnect before it is cancelled


class _Outbox:
    """Messages the app sent, handed to the caller's thread; bounded by a semaphore the
    reader releases from its side."""

    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane
        self._messages: queue.Queue[Message | BaseException | None] = queue.Queue()
        self._room: asyncio.Semaphore | None = None  # made on the loop, at first use

    async def put(self, message: Message) -> None:
        if self._room is None:
            self._room = asyncio.Semaphore(MAX_BUFFERED)
        await self._room.acquire()
        self._messages.put(message)

    def end(self, error: BaseException | None) -> None:
        self._messages.put(error)  # None: the app returned

    def get(self, timeout_s: float | None) -> Message | BaseException | None:
        try:
            item = self._messages.get(timeout=timeout_s)
        except queue.Empty:
            raise httpx.ReadTimeout(f"The app sent nothing for {timeout_s} s") from None
        if isinstance(item, dict) and self._room is not None:
            room = self._room
            self._plane.call_soon(room.release)
        return item


async def _drive(app: ASGIApp, scope: Scope, receive: Any, outbox: _Outbox) -> None:
    try:
        await app(scope, receive, outbox.put)
    except BaseException as exc:
        outbox.end(exc)
        raise
    outbox.end(None)


def _timeout(request: httpx.Request) -> float | None:
    timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
    return timeouts.get("read")


def _scope(kind: str, url: httpx.URL, headers: httpx.Headers, method: str = "GET") -> Scope:
    return {
        "type": kind,
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": {"https": "https", "wss": "wss", "ws": "ws"}.get(url.scheme, "http"),
        "path": url.path,
        "raw_path": url.raw_path.split(b"?")[0],
        "query_string": url.query,
        "root_path": "",
        "headers": [(key.lower(), value) for key, value in headers.raw],
        "client": ("127.0.0.1", 50000),
        "server": (url.host, url.port or (443 if url.scheme in ("https", "wss") else 80)),
        # As uvicorn offers it: a WebSocket app may answer its handshake with a response.
        "extensions": {DENIAL_EXTENSION: {}} if kind == "websocket" else {},
    }


class _HTTPExchange:
    """One request: the body goes in at once; the disconnect comes when the caller closes."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self._sent_body = False
        self._disconnected: asyncio.Event | None = None

    async def receive(self) -> Message:
        if not self._sent_body:
            self._sent_body = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        if self._disconnected is None:
            self._disconnected = asyncio.Event()
        await self._disconnected.wait()
        return {"type": "http.disconnect"}

    def disconnect(self) -> None:
        """On the loop: the client has gone."""
        if self._disconnected is None:
            self._disconnected = asyncio.Event()
        self._disconnected.set()


class _ResponseBody(httpx.SyncByteStream):
    def __init__(
        self,
        plane: DataPlane,
        exchange: _HTTPExchange,
        outbox: _Outbox,
        task: Pending[None],
        timeout_s: float | None,
    ) -> None:
        self._plane = plane
        self._exchange = exchange
        self._outbox = outbox
        self._task = task
        self._timeout_s = timeout_s
        self._ended = False

    def __iter__(self) -> Iterator[bytes]:
        while not self._ended:
            item = self._outbox.get(self._timeout_s)
            if item is None:
                self._ended = True
                return
            if isinstance(item, BaseException):
                self._ended = True
                raise httpx.RemoteProtocolError(f"The app failed mid-response: {item!r}") from item
            if item["type"] == "http.response.body":
                if item.get("body"):
                    yield bytes(item["body"])
                if not item.get("more_body", False):
                    self._ended = True
                    self.close()
                    return

    def close(self) -> None:
        if not self._task.done():
            self._plane.call_soon(self._exchange.disconnect)
            try:
                self._task.result(CLOSE_GRACE_S)
            except TimeoutError:
                self._task.cancel()
            except BaseException:  # noqa: BLE001 (what the app raised after the client left is its own affair)
                pass


class InProcessTransport(httpx.BaseTransport):
    """Sends each request to ``app`` on ``plane``'s loop; responses stream."""

    def __init__(self, plane: DataPlane, app: ASGIApp) -> None:
        self._plane = plane
        self._app = app

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        exchange = _HTTPExchange(request.read())
        outbox = _Outbox(self._plane)
        scope = _scope("http", request.url, request.headers, request.method)
        task = self._plane.submit(_drive(self._app, scope, exchange.receive, outbox))
        timeout_s = _timeout(request)
        body = _ResponseBody(self._plane, exchange, outbox, task, timeout_s)
        while True:
            item = outbox.get(timeout_s)
            if item is None or isinstance(item, BaseException):
                body.close()
                raise httpx.RemoteProtocolError("The app ended without a response") from item
            if item["type"] == "http.response.start":
                headers = [(bytes(key), bytes(value)) for key, value in item.get("headers", [])]
                return httpx.Response(item["status"], headers=headers, stream=body, request=request)


class WebSocketSession:
    """A WebSocket to an app on a data plane's loop, with Starlette's TestClient methods."""

    def __init__(
        self, plane: DataPlane, app: ASGIApp, url: httpx.URL, headers: httpx.Headers, timeout_s: float
    ) -> None:
        self._plane = plane
        self._timeout_s = timeout_s
        self._inbox: asyncio.Queue[Message] | None = None
        self._outbox = _Outbox(plane)
        self._pending: list[Message] = [{"type": "websocket.connect"}]
        scope = _scope("websocket", url, headers)
        scope["subprotocols"] = [
            part.strip() for part in headers.get("sec-websocket-protocol", "").split(",") if part.strip()
        ]
        self._task = plane.submit(_drive(app, scope, self._receive, self._outbox))
        self.accepted_subprotocol: str | None = None
        self.extra_headers: list[tuple[bytes, bytes]] = []
        message = self._next()
        if message["type"] == "websocket.close":
            self._finish()
            raise WebSocketDisconnect(message.get("code", 1000), message.get("reason", ""))
        if message["type"] == "websocket.http.response.start":
            self._finish()
            raise WebSocketDisconnect(1006, f"The handshake was refused with HTTP {message['status']}")
        self.accepted_subprotocol = message.get("subprotocol")
        self.extra_headers = list(message.get("headers", []))

    async def _receive(self) -> Message:
        if self._inbox is None:
            self._inbox = asyncio.Queue()  # holds what the test itself sent and the app has not read
            for message in self._pending:
                self._inbox.put_nowait(message)
        return await self._inbox.get()

    def _push(self, message: Message) -> None:
        def put() -> None:
            if self._inbox is None:
                self._pending.append(message)
            else:
                self._inbox.put_nowait(message)

        self._plane.call_soon(put)

    def _next(self) -> Message:
        item = self._outbox.get(self._timeout_s)
        if item is None:
            raise WebSocketDisconnect(1006, "The app ended without closing the socket")
        if isinstance(item, BaseException):
            raise WebSocketDisconnect(1011, f"The app failed: {item!r}")
        return item

    def _finish(self) -> None:
        try:
            self._task.result(CLOSE_GRACE_S)
        except TimeoutError:
            self._task.cancel()
        except BaseException:  # noqa: BLE001 (the socket is closed either way)
            pass

    def send(self, message: Message) -> None:
        self._push(message)

    def send_text(self, data: str) -> None:
        self._push({"type": "websocket.receive", "text": data})

    def send_bytes(self, data: bytes) -> None:
        self._push({"type": "websocket.receive", "bytes": data})

    def send_json(self, data: Any) -> None:
        self.send_text(json.dumps(data))

    def receive(self) -> Message:
        return self._next()

    def receive_text(self) -> str:
        message = self._received()
        return str(message["text"])

    def receive_bytes(self) -> bytes:
        message = self._received()
        return bytes(message["bytes"])

    def receive_json(self) -> Any:
        message = self._received()
        return json.loads(message.get("text") or message["bytes"])

    def _received(self) -> Message:
        message = self._next()
        if message["type"] == "websocket.close":
            raise WebSocketDisconnect(message.get("code", 1000), message.get("reason", ""))
        return message

    def close(self, code: int = 1000, reason: str = "") -> None:
        if not self._task.done():
            self._push({"type": "websocket.disconnect", "code": code, "reason": reason})
            self._finish()

    def __enter__(self) -> WebSocketSession:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
