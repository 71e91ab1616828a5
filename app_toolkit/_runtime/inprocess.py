"""Drive an ASGI app on a data plane's loop from a blocking caller's thread.

:class:`InProcessTransport` is an httpx transport whose responses stream: the status
and headers arrive as soon as the app sends them, and the body is read chunk by chunk
while the app is still producing it (SSE line by line). Closing the response early is a
client disconnect: the app's ``receive()`` returns ``http.disconnect``, and the request's
:class:`MemoryLink` (the front's ``RequestLink``, over these in-memory writes) tells the
front at once, as our HTTP protocol does from ``connection_lost``.
:class:`WebSocketSession` is the same for a WebSocket. Both keep at most
``MAX_BUFFERED`` unread messages from the app; the app waits when the reader falls behind.
"""

from __future__ import annotations

import asyncio
import json
import queue
from collections.abc import Callable, Iterator
from typing import Any

import httpx
from starlette.types import ASGIApp, Message, Scope
from starlette.websockets import WebSocketDisconnect

from app_toolkit._runtime.answers import DENIAL_EXTENSION
from app_toolkit._runtime.connection_table import Handed
from app_toolkit._runtime.front.request_link import REQUEST_LINK
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

    def cut_off(self) -> None:
        """The response was cut off after its head: the reader's next read fails, as a
        client's read of a connection aborted mid-response does."""
        self._messages.put(httpx.RemoteProtocolError("The server cut the response off"))

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
        self.sent_body = False  # its one piece was read
        self.disconnected = False
        self._gone: asyncio.Event | None = None
        self.link: MemoryLink | None = None  # made with the request's scope

    async def receive(self) -> Message:
        if not self.sent_body:
            self.sent_body = True
            return {"type": "http.request", "body": self._body, "more_body": False}
        if self._gone is None:
            self._gone = asyncio.Event()
        await self._gone.wait()
        return {"type": "http.disconnect"}

    def body_ready(self) -> bool:
        """The body is here whole: the next ``receive()`` returns at once until it was
        taken, then only once the client has gone."""
        return not self.sent_body or self.disconnected

    def disconnect(self) -> None:
        """On the loop: the client has gone."""
        self.disconnected = True
        if self._gone is None:
            self._gone = asyncio.Event()
        self._gone.set()
        left = self.link.on_client_left if self.link is not None else None
        if left is not None:
            left()


class MemoryLink:
    """The front's ``RequestLink`` for a request sent in memory (the in-process transport):
    writes are messages handed over as they come (nothing to hold or gather); ``ready``
    says whether the next ``receive()`` returns at once; ``cut_off`` makes the reader
    fail, as a client's read of a connection aborted mid-response does."""

    __slots__ = ("on_client_left", "handed", "_ready", "_cut_off")

    def __init__(self, ready: Callable[[], bool], cut_off: Callable[[], None]) -> None:
        self.on_client_left: Callable[[], None] | None = None
        self.handed: Handed | None = None  # no connection, so none handed over
        self._ready = ready
        self._cut_off = cut_off

    def body_ready(self) -> bool:
        return self._ready()

    def body_arriving(self) -> bool:
        return False  # it arrived whole, with the request

    def join_head_and_body(self) -> None:
        pass  # each message is handed over as it comes: nothing to join

    def gather_writes(self) -> None:
        pass

    def release(self) -> None:
        pass

    def abort(self) -> None:
        self.on_client_left = None
        self._cut_off()


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
        scope[REQUEST_LINK] = exchange.link = MemoryLink(exchange.body_ready, outbox.cut_off)
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
