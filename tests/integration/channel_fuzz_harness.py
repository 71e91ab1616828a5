"""The harness for ``test_channel_fuzz.py``: a scripted fake replica and a well-behaved
one behind a real ``HTTPFront`` on 127.0.0.1, a strict h11 client, the outcomes a case may
expect and ``run_case``, which serves one case beside a good stream and checks it."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import h11

from app_toolkit._runtime.channel.client import ChannelClient
from app_toolkit._runtime.channel.frames import encode_answer, plain_dumps
from app_toolkit._runtime.channel.server import ResponseSink, start_server
from app_toolkit._runtime.front.http_front import HTTPFront
from app_toolkit._runtime.front.server import ProxyServer, serve
from app_toolkit._runtime.loop_thread import LoopThread
from app_toolkit._runtime.messages import (
    END,
    Answer,
    BodyChunk,
    DeploymentID,
    HTTPRequest,
    HTTPResponseStart,
    Rejected,
    ReplicaInfo,
    Request,
    RouteInfo,
)
from app_toolkit._runtime.routing.dispatcher import Dispatcher
from app_toolkit._runtime.tables import ApplicationTable
from app_toolkit.config import HTTPOptions
from app_toolkit.exceptions import RequestLostError

TOKEN = b"0123456789abcdef"
FUZZ = DeploymentID("fuzz", "Ingress")
GOOD = DeploymentID("good", "Ingress")
#: Every wait of the client on the proxy, in seconds: a case that outlasts it hangs.
WAIT_S = 5.0

# ------------------------------------------------------------------ the fake replica's steps


@dataclass(frozen=True)
class Say:
    """Send ``answer`` for this request, framed as a replica frames it."""

    answer: Answer


@dataclass(frozen=True)
class Frame:
    """A frame of ``kind`` with ``payload`` for this request (a kind no answer has, or a
    payload that decodes to no answer)."""

    kind: int
    payload: bytes = b""


@dataclass(frozen=True)
class Misnumbered:
    """Send ``answer`` under another request's number: ``to`` names that request's case,
    or is "" for a number nobody uses."""

    answer: Answer
    to: str = ""


@dataclass(frozen=True)
class Cut:
    """Close the channel connection (every request on it is lost)."""


@dataclass(frozen=True)
class Await:
    """Wait until the event ``name`` is set (by another case's :class:`Signal`)."""

    name: str


@dataclass(frozen=True)
class Signal:
    name: str


Step = Say | Frame | Misnumbered | Cut | Await | Signal


def _case(request: Request) -> str:
    """The case a request belongs to: its path's last segment."""
    assert isinstance(request, HTTPRequest)
    return str(request.scope["path"]).rsplit("/", 1)[-1]


class FakeReplica:
    """Answers each request with the steps of its case (the path's last segment)."""

    def __init__(self) -> None:
        self.scripts: dict[str, Sequence[Step]] = {}
        self.sinks: dict[str, ResponseSink] = {}
        self.events: dict[str, asyncio.Event] = {}

    def admit(self, beyond_limit: bool = False) -> Rejected | None:
        return None

    def unserved(self) -> None:
        pass  # admit counts nothing

    def event(self, name: str) -> asyncio.Event:
        return self.events.setdefault(name, asyncio.Event())

    async def serve(self, request: Request, sink: ResponseSink) -> None:
        case = _case(request)
        self.sinks[case] = sink
        # The server's sink and its connection: raw frames go out in order with its own.
        wire = cast(Any, sink)._conn
        for step in self.scripts[case]:
            match step:
                case Say(answer):
                    sink.send(answer)
                case Frame(kind, payload):
                    wire.send(kind, cast(Any, sink)._number, [payload])
                case Misnumbered(answer, to):
                    number = cast(Any, self.sinks[to])._number if to else 1 << 40
                    kind, parts = encode_answer(answer, plain_dumps)
                    wire.send(kind, number, parts)
                case Cut():
                    wire.close()
                case Await(name):
                    await asyncio.wait_for(self.event(name).wait(), WAIT_S)
                case Signal(name):
                    self.event(name).set()
            await asyncio.sleep(0)


class GoodReplica:
    """A well-behaved replica: streams ``g1``, waits for its case's release, ``g2``, ends."""

    def __init__(self) -> None:
        self.released: dict[str, asyncio.Event] = {}

    def admit(self, beyond_limit: bool = False) -> Rejected | None:
        return None

    def unserved(self) -> None:
        pass  # admit counts nothing

    async def serve(self, request: Request, sink: ResponseSink) -> None:
        case = _case(request)
        release = self.released.setdefault(case, asyncio.Event())
        sink.send(HTTPResponseStart(200, [(b"content-type", b"text/plain")]))
        sink.send(BodyChunk(b"g1"))
        await asyncio.wait_for(release.wait(), WAIT_S)
        sink.send(BodyChunk(b"g2"))
        sink.send(END)


class Tables:
    """The controller's tables as the front reads them: two apps, one replica each."""

    def __init__(self, ports: dict[DeploymentID, int]) -> None:
        self.ports = ports
        self.dispatchers = {
            deployment: Dispatcher(deployment, _connect, lost_error=RequestLostError) for deployment in ports
        }
        self.republish()

    def republish(self) -> None:
        """The controller's table again (a lost connection takes the replica out of it)."""
        for deployment, dispatcher in self.dispatchers.items():
            info = ReplicaInfo(deployment.app, deployment, "127.0.0.1", self.ports[deployment], TOKEN, 100)
            dispatcher.update([info], 100)

    def watch(self, key: str, apply: Any) -> asyncio.Event:
        routes = tuple(RouteInfo(f"/{d.app}", d.app, d) for d in self.dispatchers)
        apply(ApplicationTable(routes))
        return asyncio.Event()

    def dispatcher(self, deployment: DeploymentID) -> Dispatcher:
        return self.dispatchers[deployment]


def _connect(info: ReplicaInfo) -> ChannelClient:
    return ChannelClient(info.host, info.port, info.token)


@dataclass
class Harness:
    thread: LoopThread
    fake: FakeReplica
    good: GoodReplica
    tables: Tables
    port: int
    cases: int = 0

    def call(self, function: Any) -> Any:
        return self.thread.call(function).result(WAIT_S)


async def _start(fake: FakeReplica, good: GoodReplica) -> tuple[Tables, ProxyServer, list[asyncio.Server]]:
    fake_server, fake_port = await start_server(fake, "127.0.0.1", TOKEN)
    good_server, good_port = await start_server(good, "127.0.0.1", TOKEN)
    tables = Tables({FUZZ: fake_port, GOOD: good_port})
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    front = HTTPFront(tables, HTTPOptions())  # type: ignore[arg-type]  # the tables a subscriber holds
    return tables, await serve(front, HTTPOptions(), sock), [fake_server, good_server]


@contextmanager
def started_harness() -> Iterator[Harness]:
    """Both replicas and the proxy on a loop thread of their own, stopped on the way out."""
    thread = LoopThread("channel-fuzz")
    fake, good = FakeReplica(), GoodReplica()
    tables, proxy, servers = thread.run(_start(fake, good), WAIT_S)
    try:
        yield Harness(thread, fake, good, tables, proxy.port)
    finally:

        async def stop() -> None:
            await proxy.stop(WAIT_S)
            for dispatcher in tables.dispatchers.values():
                dispatcher.close("the test is over")
            for server in servers:
                server.close()
                await server.wait_closed()

        thread.run(stop(), 2 * WAIT_S)
        thread.stop()


# ------------------------------------------------------------------------------ the client


@dataclass
class Seen:
    """What the client read of one response."""

    status: int | None = None
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytes = b""
    clean: bool = False  # it ended as HTTP says a response ends (not by the connection's end)


class Client:
    """One HTTP/1.1 connection to the proxy, read with h11 (a strict parser)."""

    def __init__(self, port: int, path: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        self.h11 = h11.Connection(h11.CLIENT)
        self.seen = Seen()
        request = h11.Request(
            method="POST", target=path, headers=[("host", "proxy"), ("content-length", "0")]
        )
        self.sock.sendall(self.h11.send(request) + self.h11.send(h11.EndOfMessage()))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def read(self, until_data: bool = False) -> Seen:
        """Read the response to its end (or the connection's), or until_data: to its
        first body bytes."""
        while not self.seen.clean:
            event = self._next()
            if event is None:
                break
            if isinstance(event, h11.Response):
                self.seen.status = event.status_code
                self.seen.headers = dict(event.headers)
            elif isinstance(event, h11.Data):
                self.seen.body += event.data
                if until_data:
                    return self.seen
            elif isinstance(event, h11.EndOfMessage):
                self.seen.clean = True
        return self.seen

    def _next(self) -> Any:
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError:  # the connection ended mid-response
                return None
            if event is not h11.NEED_DATA:
                return None if isinstance(event, h11.ConnectionClosed) else event
            try:
                data = self.sock.recv(1 << 20)
            except ConnectionResetError:
                data = b""
            except TimeoutError:
                raise AssertionError(f"the proxy did not answer within {WAIT_S} s: {self.seen}") from None
            self.h11.receive_data(data)


# ----------------------------------------------------------------------------- the oracle


@dataclass(frozen=True)
class Whole:
    """The client gets this response, complete."""

    status: int
    body: bytes


@dataclass(frozen=True)
class Refused:
    """The client gets 502: nothing of the replica's response went out."""


@dataclass(frozen=True)
class CutOff:
    """The head went out (``status``), then the response was cut off: the client never
    takes it for complete, unless it declared ``length`` and that much had come."""

    status: int
    body: bytes  # what of it may reach the client (sent before it went wrong, within its length)
    length: int | None = None


Outcome = Whole | Refused | CutOff


def check(seen: Seen, expected: Outcome) -> None:
    match expected:
        case Whole(status, body):
            assert (seen.status, seen.body, seen.clean) == (status, body, True), seen
        case Refused():
            assert (seen.status, seen.clean) == (502, True), seen
            assert b"Bad Gateway" in seen.body
        case CutOff(status, body, length):
            assert seen.status == status, seen
            assert body.startswith(seen.body), seen
            if seen.clean:  # only a response whose declared length all came ends cleanly
                assert length is not None and len(seen.body) == length, seen


class LogRecords(logging.Handler):
    """The records of one case, from every logger that does not propagate to the root."""

    LOGGERS = ("", "uvicorn", "uvicorn.error", "app_toolkit")

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> LogRecords:
        for name in self.LOGGERS:
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeHandler(self)

    def tracebacks(self) -> list[str]:
        return [f"{r.name}: {r.getMessage()}" for r in self.records if r.exc_info]


def run_case(harness: Harness, steps: Sequence[Step], expected: Outcome) -> None:
    """Serve one case beside a well-behaved stream and check the invariants."""
    harness.cases += 1
    case = f"c{harness.cases}"
    harness.call(harness.tables.republish)
    harness.fake.scripts[case] = steps
    with LogRecords() as logs, Client(harness.port, f"/good/{case}") as beside:
        assert beside.read(until_data=True).body == b"g1"  # its stream is open across the case
        with Client(harness.port, f"/fuzz/{case}") as fuzzed:
            check(fuzzed.read(), expected)
        harness.call(lambda: harness.good.released[case].set())
        assert beside.read() == Seen(200, beside.seen.headers, b"g1g2", True)
    assert not logs.tracebacks(), logs.tracebacks()
