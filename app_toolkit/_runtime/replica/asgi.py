"""An ASGI app inside a replica: its lifespan, a plain deployment's ``__call__`` as an
app, and the channel's side of one HTTP request or WebSocket (the rules of running one:
``run_app.py``)."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app_toolkit._runtime import request_context
from app_toolkit._runtime.channel.flow import Inbound
from app_toolkit._runtime.channel.server import ResponseSink
from app_toolkit._runtime.messages import (
    CLOSE_SERVICE_RESTART,
    END,
    BodyChunk,
    CallFailure,
    HTTPRequest,
    HTTPResponse,
    HTTPResponseStart,
    WebSocketMessage,
    WebSocketOpen,
)
from app_toolkit._runtime.replica.user_code import is_async
from app_toolkit.exceptions import DeployError

logger = logging.getLogger("app_toolkit.replica")


_ASGI = {"version": "3.0", "spec_version": "2.3"}
#: What ends a streamed response whose app raised after sending its head.
STREAM_FAILED = CallFailure("StreamError", "the app failed after its response started", None)


class Lifespan:
    """Drives the ASGI lifespan protocol for one replica.

    Apps that do not speak lifespan (they raise on the scope) are served without it, as
    uvicorn's ``lifespan="auto"`` does.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.state: dict[str, object] = {}
        self._events: asyncio.Queue[Message] = asyncio.Queue()
        self._started = asyncio.Event()
        self._stopped = asyncio.Event()
        self._failure: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._supported = True

    async def startup(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        await self._events.put({"type": "lifespan.startup"})
        waiter = asyncio.ensure_future(self._started.wait())
        await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._failure is not None:
            raise DeployError(f"Lifespan startup failed: {self._failure}")

    async def shutdown(self, timeout_s: float) -> None:
        if self._task is None or self._task.done() or not self._supported:
            return
        await self._events.put({"type": "lifespan.shutdown"})
        try:
            await asyncio.wait_for(self._stopped.wait(), timeout_s)
        except TimeoutError:
            logger.warning("Lifespan shutdown did not finish in %.1f s", timeout_s)
            self._task.cancel()

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": _ASGI, "state": self.state}
        try:
            await self.app(scope, self._events.get, self._send)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            if not self._started.is_set() and self._failure is None:
                if _is_unsupported(exc):
                    self._supported = False
                    self._started.set()
                    return
                self._failure = _last_line(f"{type(exc).__name__}: {exc}")
                self._started.set()
            elif self._failure is None:
                logger.exception("Lifespan raised after startup")
        finally:
            self._stopped.set()

    async def _send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "lifespan.startup.complete":
            self._started.set()
        elif kind == "lifespan.startup.failed":
            self._failure = _last_line(str(message.get("message", "")) or "startup failed")
            self._started.set()
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            if kind.endswith("failed"):
                logger.error("Lifespan shutdown failed: %s", message.get("message", ""))
            self._stopped.set()


def _is_unsupported(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "lifespan" in text or isinstance(exc, (KeyError, AssertionError, NotImplementedError))


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else text


class ChannelResponse:
    """One request's ASGI channel inside a replica (a ``run_app.HTTPOut``): the scope the
    app runs on (a copy of the forwarded one), the body in
    (whole, or its start and then the pieces the caller streams into ``sink.inbound``), the
    response out as answers — one HTTPResponse when the body comes in one piece, else a
    head, chunks, the end."""

    __slots__ = (
        "_request",
        "scope",
        "_sink",
        "_body_sent",
        "_body_more",
        "_finished",
        "_ended",
        "_status",
        "_headers",
        "_started",
        "head_seen",
        "complete",
    )

    def __init__(self, request: HTTPRequest, sink: ResponseSink) -> None:
        self._request = request
        self.scope = dict(request.scope)  # the app's routing writes the matched route into it
        self._sink = sink
        self._body_sent = False
        self._body_more = request.more_body  # pieces of the body are still to come
        # Set once the response is complete or the app returned; made only if the app
        # waits on receive() after its body (most apps never do).
        self._finished: asyncio.Event | None = None
        self._ended = False
        self._status = 500
        self._headers: list[tuple[bytes, bytes]] = []
        self._started = False  # the response head went out as its own frame
        self.head_seen = False
        self.complete = False

    async def receive(self) -> Message:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self._request.body, "more_body": self._body_more}
        inbound = self._sink.inbound
        if self._body_more and inbound is not None:
            message = await inbound.get()
            self._body_more = bool(message.get("more_body"))
            return message
        if not self._ended:
            if self._finished is None:
                self._finished = asyncio.Event()
            await self._finished.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.head_seen = True
            self._status = int(message["status"])
            self._headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
        elif kind == "http.response.body" and not self.complete:
            await self._body(message.get("body", b""), message.get("more_body", False))

    async def _body(self, body: bytes, more: bool) -> None:
        sink = self._sink
        if not self._started and not more:
            self._finish()
            sink.send(HTTPResponse(self._status, self._headers, bytes(body), self.route))
            return
        if not self._started:
            self._started = True
            sink.send(HTTPResponseStart(self._status, self._headers, self.route))
        if body:
            sink.send(BodyChunk(body))
            await sink.drain()
        if not more:
            self._finish()
            sink.send(END)

    @property
    def route(self) -> str:
        """The path template of the route that matched (Starlette/FastAPI routing
        records it in the scope), never the raw path; "" if none did."""
        return request_context.route_template(self.scope)

    def refused(self) -> bool:
        return False  # the proxy reads the body within its bounds and answers a refusal

    async def answer(self, response: HTTPResponse) -> None:
        self._finish()
        self._sink.send(response)

    async def cut_off(self, why: str) -> None:
        # The proxy cuts the client's response off when the stream ends in a failure.
        self._finish()
        if not self._started:
            self._started = True
            self._sink.send(HTTPResponseStart(self._status, self._headers, self.route))
        self._sink.send(STREAM_FAILED)

    def _finish(self) -> None:
        self.complete = True
        self.end()

    def end(self) -> None:
        """Nothing more will be sent: an app waiting in receive() hears "disconnect"."""
        self._ended = True
        if self._finished is not None:
            self._finished.set()


def failing_app(error: Exception) -> ASGIApp:
    """What serves a request when something around its app failed (finding the app,
    starting its span, making its context): an app that raises ``error``, so the client
    gets what an app that raised gets (``run_app.py``), by the same rules."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise error

    return app


def request_app(target: Callable[..., Any]) -> ASGIApp:
    """Serve a plain deployment's ``__call__(request)`` over HTTP (Ray Serve's basic form).

    It gets a Starlette ``Request`` (nothing, if it takes no parameters); a returned
    ``Response`` is sent as is, ``str`` as text, ``bytes`` as octets, anything else as JSON.
    """
    from fastapi.encoders import jsonable_encoder
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response

    asynchronous = is_async(target)
    try:
        takes_request = bool(inspect.signature(target).parameters)
    except (TypeError, ValueError):  # no signature to read (a builtin): give it the request
        takes_request = True

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise NotImplementedError(f"{scope['type']} is not served by a plain deployment")
        arguments = (Request(scope, receive),) if takes_request else ()
        if asynchronous:
            result = await target(*arguments)
        else:
            result = await asyncio.to_thread(target, *arguments)
        if isinstance(result, Response):
            response = result
        elif isinstance(result, str):
            response = PlainTextResponse(result)
        elif isinstance(result, (bytes, bytearray)):
            response = Response(bytes(result), media_type="application/octet-stream")
        else:
            response = JSONResponse(jsonable_encoder(result))
        await response(scope, receive, send)

    return app


class ChannelSocket:
    """One WebSocket's ASGI channel inside a replica (a ``run_app.SocketOut``): the scope
    the app runs on, the client's messages from ``sink.inbound``, every message the app
    sends out as a WebSocketMessage (the caller sends END after the app's run)."""

    __slots__ = ("_sink", "_inbound", "_connected", "scope")

    def __init__(self, request: WebSocketOpen, sink: ResponseSink) -> None:
        assert sink.inbound is not None  # the channel server makes one for every WebSocket
        self._sink = sink
        self._inbound: Inbound = sink.inbound
        self._connected = False
        self.scope = dict(request.scope)

    async def receive(self) -> Message:
        if not self._connected:
            self._connected = True
            return {"type": "websocket.connect"}
        message: Message = await self._inbound.get()
        return message

    async def emit(self, message: Message) -> None:
        self._sink.send(WebSocketMessage(dict(message)))
        await self._sink.drain()

    async def close_with(self, messages: Sequence[Message]) -> None:
        for message in messages:
            self._sink.send(WebSocketMessage(dict(message)))

    def restarted(self) -> None:
        self._inbound.put({"type": "websocket.disconnect", "code": CLOSE_SERVICE_RESTART})
