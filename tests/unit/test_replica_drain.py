"""A replica's drain, in process (the channel path's answers into a fake sink): open
streams and WebSockets run on to the deadline (``graceful_shutdown_timeout_s``), each
then ends the way its clients understand, and the drain goes on once they have; a
resumable stream ends when the drain starts; a hurried drain ends them all at once."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse

import app_toolkit as tk
from app_toolkit._runtime import answers
from app_toolkit._runtime.channel.flow import Inbound
from app_toolkit._runtime.messages import (
    Answer,
    BodyChunk,
    DeploymentID,
    HTTPRequest,
    HTTPResponse,
    StreamEnd,
    WebSocketMessage,
    WebSocketOpen,
)
from app_toolkit._runtime.replica import replica
from app_toolkit._runtime.replica.replica import ReplicaCore
from app_toolkit.config import DeploymentConfig
from tests.unit.scopes import http_scope
from tests.waiting import wait_for_async

pytestmark = pytest.mark.anyio

GRACE_S = 0.4
#: The moment a drain gives its last events (``LAST_EVENT_S``), set per test: long where a
#: test shows the drain did not wait it out, short where it shows the drain waited it and
#: no longer; either way far from the bound the test checks, so a loaded machine's stalls
#: (CI's two cores) cannot reach it.
LONG_MOMENT_S = 10.0
SHORT_MOMENT_S = 0.3

app = FastAPI()


@app.get("/feed")
async def feed(resumable: bool = False) -> tk.EventStream:
    async def ticks() -> AsyncIterator[str]:
        while True:
            yield "tick"
            await asyncio.sleep(0.02)

    return tk.EventStream(ticks(), end_at_drain=resumable)


@app.get("/bytes")
async def plain_bytes() -> StreamingResponse:
    async def chunks() -> AsyncIterator[bytes]:
        while True:
            yield b"x"
            await asyncio.sleep(0.02)

    return StreamingResponse(chunks())


@app.websocket("/ws")
async def echo(socket: WebSocket) -> None:
    await socket.accept()
    try:
        while True:
            await socket.send_text(await socket.receive_text())
    except WebSocketDisconnect:
        pass


@app.websocket("/deaf")
async def deaf(socket: WebSocket) -> None:
    """Accepts, then hears nothing (not even its client leaving) for an hour."""
    await socket.accept()
    await socket.send_text("hello")
    await asyncio.sleep(3600)


@tk.ingress(app)
class Ingress:
    pass


held = FastAPI()
#: The requests each waiting, in ``/held``, for the replica's ``__del__`` to end them.
HELD: list[asyncio.Future[None]] = []


@held.get("/held")
async def wait_held() -> str:
    waiting = asyncio.get_running_loop().create_future()
    HELD.append(waiting)
    await waiting
    return "served"


@tk.ingress(held)
class Holder:
    """Its requests run until its ``__del__`` ends them, as a model's engine ends its
    replies when it closes."""

    async def __del__(self) -> None:
        for waiting in HELD:
            waiting.set_exception(RuntimeError("the engine stopped"))


@dataclass
class Sink:
    """Collects a request's answers, with when (loop time) each came."""

    inbound: Inbound | None = None
    answers: list[tuple[float, Answer]] = field(default_factory=list)

    def send(self, answer: Answer) -> None:
        self.answers.append((asyncio.get_running_loop().time(), answer))

    async def drain(self) -> None:
        await asyncio.sleep(0)

    @property
    def ended_at(self) -> float | None:
        return next((at for at, answer in self.answers if isinstance(answer, StreamEnd)), None)

    def body(self) -> bytes:
        return b"".join(answer.data for _, answer in self.answers if isinstance(answer, BodyChunk))


async def started_core(grace_s: float = GRACE_S, definition: type = Ingress) -> ReplicaCore:
    config = DeploymentConfig(graceful_shutdown_timeout_s=grace_s, graceful_shutdown_wait_loop_s=0.05)
    deployment = DeploymentID("a", definition.__name__)
    core = ReplicaCore("r1", deployment, config, definition, ((), {}), pickle.dumps)
    await core.start()
    return core


class Requests:
    """Requests served by ``core`` in tasks of their own, as the channel server runs them."""

    def __init__(self, core: ReplicaCore) -> None:
        self.core = core
        self.tasks: list[asyncio.Task[None]] = []

    async def http(self, path: str, query: bytes = b"") -> Sink:
        sink = Sink()
        self._serve(HTTPRequest(f"req-{len(self.tasks)}", http_scope(path, query), b""), sink)
        await wait_for_async(lambda: any(isinstance(a, BodyChunk) for _, a in sink.answers))
        return sink

    async def websocket(self, path: str = "/ws") -> Sink:
        sink = Sink(Inbound(lambda credit: None))
        scope = {**http_scope(path), "type": "websocket", "scheme": "ws", "subprotocols": []}
        del scope["method"]
        self._serve(WebSocketOpen(f"ws-{len(self.tasks)}", scope), sink)
        assert sink.inbound is not None
        sink.inbound.put({"type": "websocket.receive", "text": "hello"})
        await wait_for_async(lambda: len(sink.answers) >= 2)  # accepted, echoed
        return sink

    def _serve(self, request: HTTPRequest | WebSocketOpen, sink: Sink) -> None:
        assert self.core.admit() is None
        self.tasks.append(asyncio.ensure_future(self.core.serve(request, sink)))

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def close_code(sink: Sink) -> int | None:
    closes = [a.message for _, a in sink.answers if isinstance(a, WebSocketMessage)]
    return next((m.get("code") for m in closes if m["type"] == "websocket.close"), None)


async def test_streams_and_websockets_run_to_the_deadline_and_end_as_their_clients_understand(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replica, "LAST_EVENT_S", LONG_MOMENT_S)
    core = await started_core()
    requests = Requests(core)
    try:
        events, resumable, plain = (
            await requests.http("/feed"),
            await requests.http("/feed", b"resumable=true"),
            await requests.http("/bytes"),
        )
        socket = await requests.websocket()
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.wait_for(core.drain(), GRACE_S + LONG_MOMENT_S + 2)
        took = loop.time() - began
    finally:
        await requests.close()
    # The feed marked resumable ended when the drain began, with the drain event.
    assert resumable.ended_at is not None and resumable.ended_at - began < GRACE_S / 2
    assert b"event: drain" in resumable.body()
    # The others ran on, to the deadline: then the SSE stream sent its drain event and the
    # WebSocket its 1012 (the drain waited for both), while the plain byte stream, which
    # has no last word, was simply left running (the process is stopped next).
    assert events.ended_at is not None and events.ended_at - began >= GRACE_S
    assert events.body().endswith(
        b"event: drain\r\ndata: server is shutting down; reconnect\r\nretry: 1000\r\n\r\n"
    )
    assert close_code(socket) == 1012 and socket.ended_at is not None and socket.ended_at - began >= GRACE_S
    # It ran on through the drain (when its last byte came, not how many: a loaded host may
    # stall the loop for a second).
    last_byte = max(at for at, answer in plain.answers if isinstance(answer, BodyChunk))
    assert plain.ended_at is None and last_byte - began >= GRACE_S / 2
    # The drain did not wait out the moment for last events: they were written at once.
    assert GRACE_S <= took < GRACE_S + LONG_MOMENT_S / 2


async def test_a_hurried_drain_ends_streams_and_websockets_at_once() -> None:
    core = await started_core(grace_s=30)
    requests = Requests(core)
    try:
        events, socket = await requests.http("/feed"), await requests.websocket()
        plain = await requests.http("/bytes")
        loop = asyncio.get_running_loop()
        began = loop.time()
        drained = asyncio.ensure_future(core.drain(hurry=True))
        await wait_for_async(lambda: events.ended_at and socket.ended_at, 5, "the streams to end")
        assert not drained.done()  # the plain stream still has its grace period
        drained.cancel()
        with pytest.raises(asyncio.CancelledError):
            await drained
    finally:
        await requests.close()
    assert b"event: drain" in events.body() and close_code(socket) == 1012
    assert events.ended_at is not None and events.ended_at - began < 5  # not the 30 s grace
    assert plain.ended_at is None


async def test_the_drain_gives_what_it_ended_a_moment_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replica, "LAST_EVENT_S", SHORT_MOMENT_S)
    core = await started_core()
    requests = Requests(core)
    try:
        socket = await requests.websocket("/deaf")
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.wait_for(core.drain(), GRACE_S + SHORT_MOMENT_S + 10)
        took = loop.time() - began
    finally:
        await requests.close()
    # Told to reconnect at the deadline; its app went on, and the drain waited a moment
    # for it to end, no longer.
    assert close_code(socket) == 1012 and socket.ended_at is None
    assert GRACE_S + SHORT_MOMENT_S <= took < GRACE_S + SHORT_MOMENT_S + 5  # its app: an hour


async def test_a_request_its_destructor_ends_answers_before_the_drain_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the deadline, ``__del__`` ends what still runs (a model's engine closes under its
    replies): those requests answer their callers before the process is stopped, rather than
    being lost with it."""
    monkeypatch.setattr(replica, "LAST_EVENT_S", LONG_MOMENT_S)
    HELD.clear()
    core = await started_core(definition=Holder)
    requests = Requests(core)
    sink = Sink()
    try:
        requests._serve(HTTPRequest("held", http_scope("/held"), b""), sink)
        await wait_for_async(lambda: HELD, 5, "the request to wait")
        loop = asyncio.get_running_loop()
        began = loop.time()
        async with asyncio.timeout(GRACE_S + LONG_MOMENT_S + 2):
            await core.drain()  # awaited here: the answers are read right as it returns
        took = loop.time() - began
        statuses = [answer.status for _, answer in sink.answers if isinstance(answer, HTTPResponse)]
    finally:
        await requests.close()
    assert statuses == [500]  # the app's answer to its ended request, sent before the stop
    assert took < GRACE_S + LONG_MOMENT_S / 2  # it answered at once: the moment is not waited out


@pytest.mark.parametrize(
    ("handshake", "ends_with"),
    [("accepted", [1012]), ("none", []), ("denying", []), ("ended", [])],
)
def test_at_the_deadline_only_an_accepted_websocket_gets_a_restart_close(
    handshake: answers.HandshakeState, ends_with: list[int]
) -> None:
    """A socket not accepted yet, or whose denial is under way, is not closed (a close then
    would be a 403, or break the denial's messages); its app's own answer ends it."""
    assert [message["code"] for message in answers.restart_end(handshake)] == ends_with
