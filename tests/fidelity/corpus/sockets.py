"""WebSockets: subprotocols, messages, close codes and reasons, refusals, errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Cookie, FastAPI, Query, WebSocket, WebSocketDisconnect, WebSocketException
from fastapi.responses import PlainTextResponse

from tests.fidelity.compare import Ws


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    yield {"disconnects": asyncio.Queue()}


app = FastAPI(title="sockets", lifespan=lifespan)
SUBPROTOCOLS = ("v2.fidelity", "v1.fidelity")


@app.websocket("/echo")
async def echo(websocket: WebSocket) -> None:
    offered = websocket.scope["subprotocols"]
    chosen = next((p for p in offered if p in SUBPROTOCOLS), None)
    await websocket.accept(subprotocol=chosen, headers=[(b"x-accepted", b"yes")])
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                await websocket.state.disconnects.put([message["code"], message.get("reason")])
                return
            if message.get("text") == "bye":
                await websocket.close(4001, "bye now")
                return
            if message.get("text") == "adiós":
                await websocket.close(4002, "adiós ✓")
                return
            if message.get("text") is not None:
                await websocket.send_text("echo:" + message["text"])
            else:
                await websocket.send_bytes(message["bytes"][::-1])
    except WebSocketDisconnect:
        return


@app.websocket("/seen")
async def seen(
    websocket: WebSocket, flavour: Annotated[str, Cookie()] = "none", n: Annotated[int, Query()] = 0
) -> None:
    await websocket.accept()
    skip = {b"host", b"sec-websocket-key"}  # the port and a random key
    headers = [[k.decode(), v.decode()] for k, v in websocket.scope["headers"] if k not in skip]
    await websocket.send_json(
        {
            "subprotocols": websocket.scope["subprotocols"],
            "http_version": websocket.scope["http_version"],
            "scheme": websocket.scope["scheme"],
            "path": websocket.scope["path"],
            "root_path": websocket.scope["root_path"],
            "query": websocket.scope["query_string"].decode(),
            "headers": headers,
            "flavour": flavour,
            "n": n,
            "url_for": websocket.url_for("seen").path,
        }
    )
    await websocket.close(1000, "done")


@app.websocket("/asgi")
async def asgi(websocket: WebSocket) -> None:
    await websocket.accept()
    scope = websocket.scope
    await websocket.send_json(
        {"asgi": scope.get("asgi"), "extensions": sorted(scope.get("extensions") or {})}
    )
    await websocket.close()


@app.websocket("/needs-int")
async def needs_int(websocket: WebSocket, n: Annotated[int, Query()]) -> None:
    await websocket.accept()
    await websocket.send_text(str(n))
    await websocket.close()


@app.websocket("/deny")
async def deny(websocket: WebSocket) -> None:
    await websocket.close(code=1008, reason="not you")


@app.websocket("/denial-response")
async def denial_response(websocket: WebSocket) -> None:
    await websocket.send_denial_response(
        PlainTextResponse("token expired", status_code=401, headers={"x-why": "expired"})
    )


@app.websocket("/refuse")
async def refuse(websocket: WebSocket, token: str = "") -> None:
    """WebSocketException: before accept a refusal, after it a close with its code and reason."""
    if not token:
        raise WebSocketException(code=4003, reason="no token")
    await websocket.accept()
    await websocket.send_text("welcome")
    raise WebSocketException(code=4004, reason=f"token {token} expired")


@app.websocket("/raise-before-accept")
async def raise_before_accept(websocket: WebSocket) -> None:
    raise RuntimeError("failed before accept")


@app.websocket("/return-before-accept")
async def return_before_accept(websocket: WebSocket) -> None:
    return  # neither accepted nor closed: uvicorn answers the handshake with 500


@app.websocket("/raise-after-accept")
async def raise_after_accept(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_text("about to fail")
    raise RuntimeError("failed after accept")


@app.websocket("/last-disconnect")
async def last_disconnect(websocket: WebSocket) -> None:
    """The code and reason the echo route saw when a client closed (waits for it)."""
    await websocket.accept()
    async with asyncio.timeout(5):
        await websocket.send_json(await websocket.state.disconnects.get())
    await websocket.close()


EXCHANGES = [
    Ws(
        "echo with a subprotocol",
        "/echo",
        subprotocols=["v0.fidelity", "v1.fidelity", "v2.fidelity"],
        steps=[("send", "hi"), ("recv", None), ("send", b"\x01\x02\x03"), ("recv", None), ("send", "bye")],
    ),
    Ws("echo without a subprotocol", "/echo", steps=[("send", "one"), ("recv", None), ("send", "bye")]),
    Ws(
        "large messages, a non-ASCII close reason",
        "/echo",
        steps=[
            ("send", "x" * 300_000),
            ("recv", None),
            ("send", bytes(500_000)),
            ("recv", None),
            ("send", "adiós"),
        ],
    ),
    Ws(
        "client closes with a code", "/echo", steps=[("send", "x"), ("recv", None), ("close", (4100, "done"))]
    ),
    Ws("what the echo route saw", "/last-disconnect"),
    Ws("client closes normally", "/echo", steps=[("close", (1000, ""))]),
    Ws("what the echo route saw after 1000", "/last-disconnect"),
    Ws(
        "headers, cookies and query",
        "/seen?n=3&x=%20y",
        headers=[("cookie", "flavour=mint"), ("x-custom", "a"), ("x-custom", "b")],
    ),
    Ws("ASGI version and extensions", "/asgi"),
    Ws("query validation fails", "/needs-int?n=x"),
    Ws("closed before accept", "/deny"),
    Ws("denial response", "/denial-response"),
    Ws("WebSocketException before accept", "/refuse"),
    Ws("WebSocketException after accept", "/refuse?token=t1"),
    Ws("error before accept", "/raise-before-accept"),
    Ws("returned before accept", "/return-before-accept"),
    Ws("error after accept", "/raise-after-accept"),
    Ws("no such route", "/nowhere"),
]
