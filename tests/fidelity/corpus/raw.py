"""A plain ASGI app (no framework): how the server frames what the app sends, lifespan
state in the scope, a response sent before the request body was read."""

from __future__ import annotations

from starlette.types import Message, Receive, Scope, Send

from tests.fidelity.compare import Http


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                scope["state"]["greeting"] = "from the lifespan"
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    assert scope["type"] == "http"
    path = scope["path"].removeprefix(scope["root_path"])
    await ROUTES.get(path, not_found)(scope, receive, send)


async def start(send: Send, status: int = 200, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers or []})


async def body(send: Send, data: bytes, more: bool = False) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})


async def chunks(scope: Scope, receive: Receive, send: Send) -> None:
    await start(send, headers=[(b"content-type", b"text/plain")])
    for part in (b"one ", b"", b"two ", b"three"):
        await body(send, part, more=True)
    await body(send, b"")


async def declared(scope: Scope, receive: Receive, send: Send) -> None:
    await start(send, headers=[(b"content-length", b"10"), (b"X-Upper-Case", b"Value")])
    await body(send, b"01234", more=True)
    await body(send, b"56789")


async def start_only(scope: Scope, receive: Receive, send: Send) -> None:
    await start(send, 200, [(b"x-empty", b"")])
    await body(send, b"")


async def no_content(scope: Scope, receive: Receive, send: Send) -> None:
    await start(send, 204)
    await body(send, b"")


async def state(scope: Scope, receive: Receive, send: Send) -> None:
    await start(send)
    await body(send, str(scope["state"].get("greeting")).encode())


async def early(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers without reading the request body."""
    await start(send, 202, [(b"content-length", b"5")])
    await body(send, b"early")


async def read_all(scope: Scope, receive: Receive, send: Send) -> None:
    length = 0
    message: Message = {"more_body": True}
    while message.get("more_body", True):
        message = await receive()
        length += len(message.get("body", b""))
    await start(send)
    await body(send, f"{length} bytes, last message {message['type']}".encode())


async def fails(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("no response started")


async def head_then_return(scope: Scope, receive: Receive, send: Send) -> None:
    await start(send, 200, [(b"content-type", b"text/plain")])


async def head_then_raise(scope: Scope, receive: Receive, send: Send) -> None:
    await start(send, 200, [(b"content-type", b"text/plain")])
    await body(send, b"part", more=True)
    raise RuntimeError("failed after the response started")


async def return_nothing(scope: Scope, receive: Receive, send: Send) -> None:
    return


async def raise_after_response(scope: Scope, receive: Receive, send: Send) -> None:
    await start(send, 200, [(b"content-length", b"4")])
    await body(send, b"done")
    raise RuntimeError("failed after the whole response")


async def not_found(scope: Scope, receive: Receive, send: Send) -> None:
    await start(send, 404, [(b"content-type", b"text/plain")])
    await body(send, b"no such path")


ROUTES = {
    "/chunks": chunks,
    "/declared": declared,
    "/start-only": start_only,
    "/no-content": no_content,
    "/state": state,
    "/early": early,
    "/read-all": read_all,
    "/fails": fails,
    "/head-then-return": head_then_return,
    "/head-then-raise": head_then_raise,
    "/return-nothing": return_nothing,
    "/raise-after-response": raise_after_response,
}
BIG = bytes(2 << 20)
EXCHANGES = [
    Http("body in several messages, no length", path="/chunks"),
    Http("declared length, body in two messages", path="/declared"),
    Http("HEAD of a declared length", method="HEAD", path="/declared"),
    Http("start and an empty body", path="/start-only"),
    Http("204", path="/no-content"),
    Http("lifespan state in the scope", path="/state"),
    Http("answer before the body is read", method="POST", path="/early", body=BIG),
    Http("the connection after an unread body", path="/state"),
    Http("chunked body read whole", method="POST", path="/read-all", body=BIG, chunked=True),
    Http("not found", path="/missing"),
    Http("exception before the response starts", path="/fails"),
    Http("returned after the head, before a body", path="/head-then-return"),
    Http("exception after the response started", path="/head-then-raise"),
    Http("returned without a response", path="/return-nothing"),
    Http("exception after the whole response", path="/raise-after-response"),
]
