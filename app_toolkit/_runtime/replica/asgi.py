"""Running an ASGI app inside a replica: lifespan, and one HTTP request at a time."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app_toolkit._runtime import answers, request_context
from app_toolkit._runtime.channel.frames import Kind
from app_toolkit._runtime.channel.server import ResponseSink
from app_toolkit._runtime.messages import (
    CLOSE_INTERNAL_ERROR,
    CLOSE_SERVICE_RESTART,
    HTTPRequest,
    HTTPResponse,
    HTTPResponseStart,
    WebSocketOpen,
)
from app_toolkit.exceptions import DeployError

logger = logging.getLogger("app_toolkit.replica")


_ASGI = {"version": "3.0", "spec_version": "2.3"}


def internal_error(request_id: str) -> HTTPResponse:
    answer = answers.internal_error(request_id)
    return HTTPResponse(answer.status, answer.headers, answer.body)


class Lifespan:
    """Drives the ASGI lifespan protocol for one replica.

    Apps that do not speak lifespan (they raise on the scope) are served without it, as
    uvicorn's ``lifespan="auto"`` does.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.state: dict[str, Any] = {}
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
        except asyncio.TimeoutError:
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


async def serve_http(
    app: ASGIApp, request: HTTPRequest, lifespan_state: dict[str, Any], sink: ResponseSink
) -> None:
    """Run one request through ``app``; write one RESPONSE frame, or START/BODY…/END."""
    scope = dict(request.scope)
    scope["state"] = dict(lifespan_state)
    finished = asyncio.Event()
    body_sent = False
    status = 500
    headers: list[tuple[bytes, bytes]] = []
    started = False  # the response head went out as its own frame
    complete = False

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status, headers, started, complete
        kind = message["type"]
        if kind == "http.response.start":
            status = int(message["status"])
            headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
        elif kind == "http.response.body":
            if complete:
                return
            body = message.get("body", b"")
            more = message.get("more_body", False)
            if not started and not more:
                complete = True
                finished.set()
                sink.send(Kind.RESPONSE, HTTPResponse(status, headers, bytes(body)))
                return
            if not started:
                started = True
                sink.send(Kind.START, HTTPResponseStart(status, headers))
            if body:
                sink.send(Kind.BODY, body)
                await sink.drain()
            if not more:
                complete = True
                finished.set()
                sink.send(Kind.END, None)

    try:
        await app(scope, receive, send)
    except asyncio.CancelledError:
        raise
    except Exception:
        logger.exception("Request %s failed", request.request_id)
        if not started and not complete:
            complete = True
            sink.send(Kind.RESPONSE, internal_error(request.request_id))
        elif started and not complete:
            # The head is out; end the stream so the caller is not left waiting.
            complete = True
            sink.send(Kind.END, None)
    finally:
        finished.set()
    if not complete:
        logger.error("Request %s: the app returned without a complete response", request.request_id)
        sink.send(
            Kind.END if started else Kind.RESPONSE, None if started else internal_error(request.request_id)
        )


def request_app(target: Callable[..., Any]) -> ASGIApp:
    """Serve a plain deployment's ``__call__(request)`` over HTTP (Ray Serve's basic form).

    It gets a Starlette ``Request``; a returned ``Response`` is sent as is, ``str`` as
    text, ``bytes`` as octets, anything else as JSON.
    """
    from fastapi.encoders import jsonable_encoder
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response

    is_async = inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
        getattr(target, "__call__", None)  # noqa: B004 - an async __call__, not callability
    )

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            raise NotImplementedError(f"{scope['type']} is not served by a plain deployment")
        request = Request(scope, receive)
        if is_async:
            result = await target(request)
        else:
            result = await asyncio.to_thread(target, request)
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


async def serve_websocket(
    app: ASGIApp, request: WebSocketOpen, lifespan_state: dict[str, Any], sink: ResponseSink
) -> None:
    """Run one WebSocket connection through ``app``: client messages come from
    ``sink.inbound``, every message the app sends goes out as a WS_OUT frame, END last."""
    assert sink.inbound is not None
    inbound = sink.inbound
    scope = dict(request.scope)
    scope["state"] = dict(lifespan_state)
    connected = False
    closed = False

    async def receive() -> Message:
        nonlocal connected
        if not connected:
            connected = True
            return {"type": "websocket.connect"}
        message: Message = await inbound.get()
        return message

    async def send(message: Message) -> None:
        nonlocal closed
        if closed:
            return
        kind = message["type"]
        if kind == "websocket.close" or (
            kind == "websocket.http.response.body" and not message.get("more_body", False)
        ):
            closed = True
        sink.send(Kind.WS_OUT, dict(message))
        await sink.drain()

    def server_restarting(waited: asyncio.Future[Any]) -> None:
        # The replica drains: close with 1012 so the client reconnects (to another
        # replica), and tell the app its client is gone.
        nonlocal closed
        if waited.cancelled():
            return
        if not closed:
            closed = True
            sink.send(
                Kind.WS_OUT,
                {
                    "type": "websocket.close",
                    "code": CLOSE_SERVICE_RESTART,
                    "reason": "server restarting; reconnect",
                },
            )
        inbound.put_nowait({"type": "websocket.disconnect", "code": CLOSE_SERVICE_RESTART})

    draining = request_context.draining.get()
    watcher = asyncio.ensure_future(draining.wait()) if draining is not None else None
    if watcher is not None:
        watcher.add_done_callback(server_restarting)
    try:
        await app(scope, receive, send)
    except asyncio.CancelledError:
        raise
    except Exception:
        logger.exception("WebSocket %s failed", request.request_id)
        if not closed:
            closed = True
            sink.send(Kind.WS_OUT, {"type": "websocket.close", "code": CLOSE_INTERNAL_ERROR, "reason": ""})
    finally:
        if watcher is not None:
            watcher.cancel()
    sink.send(Kind.END, None)
