"""A resumable SSE route on an event log: a reply is written in the background by one
replica and read, and resumed by ``Last-Event-ID``, through any replica."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import app_toolkit as tk
from tests.deployments import as_deployment

app = FastAPI()


class _NameTheReplica:
    """Names the replica that served each response (``x-replica``): a test can drain the
    one its reader is on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                replica = tk.get_replica_context().replica_id.encode()
                message = {**message, "headers": [*message.get("headers", ()), (b"x-replica", replica)]}
            await send(message)

        await self.app(scope, receive, named if scope["type"] == "http" else send)


app.add_middleware(_NameTheReplica)


# --8<-- [start:replies]
@tk.deployment(num_replicas=2)
@tk.ingress(app)
class Replies:
    def __init__(self, log: tk.EventLog) -> None:
        self.log = log
        self.writing: set[asyncio.Task[None]] = set()

    @app.post("/replies")
    async def start(self, count: int = 6, delay: float = 0.05) -> dict[str, str]:
        reply = uuid.uuid4().hex
        await self.log.append(reply, "piece 0")  # readable before the id is answered
        task = asyncio.create_task(self.write(reply, count, delay))
        self.writing.add(task)
        task.add_done_callback(self.writing.discard)
        return {"reply": reply}

    async def write(self, reply: str, count: int, delay: float) -> None:
        try:
            for n in range(1, count):
                await asyncio.sleep(delay)
                await self.log.append(reply, f"piece {n}")
            await self.log.close(reply)
        except tk.UnknownStream:
            pass  # lost with the store (Redis restarted empty): its readers get 404 too

    @app.get("/replies/{reply}")
    async def events(self, reply: str, request: Request) -> tk.EventStream:
        try:
            events = await self.log.follow(reply, after=request.headers.get("last-event-id", ""))
        except tk.UnknownStream:
            raise HTTPException(404, f"No reply {reply!r}") from None
        except tk.StreamAbandoned:  # its writer died and the client has all it wrote
            raise HTTPException(410, f"Reply {reply!r} was abandoned by its writer") from None
        except ValueError as bad:
            raise HTTPException(400, str(bad)) from None
        return tk.EventStream(events)


# --8<-- [end:replies]


def make_app(redis_url: str, prefix: str, **options: Any) -> tk.Application:
    return as_deployment(Replies).options(**options).bind(tk.RedisEventLog(redis_url, prefix=prefix))
