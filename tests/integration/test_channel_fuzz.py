"""The channel fuzzed from the replica's side: a fake replica, speaking the channel's own
framing (``channel/server.py``, ``channel/frames.py``), answers the node's proxy (a real
``HTTPFront`` under our uvicorn protocol on 127.0.0.1) with well-framed but wrong
sequences, as Envoy fuzzes its upstreams' replies.

For every sequence the client gets the replica's response whole when the sequence is a
valid one, else a 502 (nothing of the response went out yet) or a response cut off
without a clean end (docs/http.md, "A replica's malformed reply"); a stream served by a
well-behaved replica across the case completes intact; no record carries a traceback;
every wait is bounded. Named cases are the regression corpus; hypothesis adds sequences.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app_toolkit._runtime.channel.client import ChannelClient
from app_toolkit._runtime.channel.frames import Kind, encode_answer, plain_dumps
from app_toolkit._runtime.channel.server import ResponseSink, start_server
from app_toolkit._runtime.front.http_front import HTTPFront
from app_toolkit._runtime.front.server import ProxyServer, serve
from app_toolkit._runtime.loop_thread import LoopThread
from app_toolkit._runtime.messages import (
    END,
    Answer,
    BodyChunk,
    CallFailure,
    CallResult,
    DeploymentID,
    Headers,
    HTTPRequest,
    HTTPResponse,
    HTTPResponseStart,
    Rejected,
    ReplicaInfo,
    Request,
    RouteInfo,
    StreamItem,
    WebSocketMessage,
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


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
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


# -------------------------------------------------------------------------- named cases

OK = HTTPResponse(200, [(b"content-type", b"text/plain")], b"fine")
HEAD = HTTPResponseStart(200, [(b"content-type", b"text/plain")])
HUGE = b"h" * (6 << 20)


def _length(n: int) -> Headers:
    return [(b"content-length", str(n).encode())]


def _bad_heads() -> dict[str, tuple[object, object]]:
    """A head's status and headers that no HTTP response may carry."""
    return {
        "status 0": (0, []),
        "status 99": (99, []),
        "status 1000": (1000, []),
        "status 100 as a final answer": (100, []),
        "status 101 to a plain request": (101, []),
        "status 600": (600, []),
        "status as text": ("200", []),
        "CR LF in a value": (200, [(b"x-a", b"1\r\nx-b: 2")]),
        "LF in a name": (200, [(b"x-a\nx-b", b"1")]),
        "NUL in a value": (200, [(b"x-a", b"\x00")]),
        "space in a name": (200, [(b"x a", b"1")]),
        "empty name": (200, [(b"", b"1")]),
        "text, not bytes": (200, [("x-a", "1")]),
        "not pairs": (200, [(b"x-a",)]),
        "headers not a list": (200, b"x-a: 1"),
        "length not a number": (200, [(b"content-length", b"abc")]),
        "negative length": (200, [(b"content-length", b"-1")]),
        "length with a sign": (200, [(b"content-length", b"+4")]),
        "two lengths that differ": (200, [(b"content-length", b"4"), (b"content-length", b"5")]),
        "length and chunked": (200, [(b"content-length", b"4"), (b"transfer-encoding", b"chunked")]),
    }


def _named() -> dict[str, tuple[list[Step], Outcome]]:
    cases: dict[str, tuple[list[Step], Outcome]] = {
        "a body chunk before the head": ([Say(BodyChunk(b"x")), Say(OK)], Refused()),
        "a stream end with no head": ([Say(END)], Refused()),
        "a call's result to an HTTP request": ([Say(CallResult(1))], Refused()),
        "a stream item to an HTTP request": ([Say(StreamItem(1)), Say(END)], Refused()),
        "a WebSocket message to an HTTP request": (
            [Say(WebSocketMessage({"type": "websocket.send", "text": "x"})), Say(END)],
            Refused(),
        ),
        "a failure before the head": ([Say(CallFailure("E", "e", None))], Refused()),
        "a frame of no kind": ([Frame(99), Say(OK)], Refused()),
        "a request's frame from the replica": ([Frame(Kind.HTTP, b"\x00junk"), Say(OK)], Refused()),
        "a credit that does not decode": ([Frame(Kind.CREDIT, b"x"), Say(OK)], Refused()),
        "a credit that does not decode mid-body": (
            [Say(HEAD), Say(BodyChunk(b"a")), Frame(Kind.CREDIT, b"x"), Say(END)],
            CutOff(200, b"a"),
        ),
        "a head that does not decode": ([Frame(Kind.START, b"junk"), Say(OK)], Refused()),
        "the channel closed before the head": ([Cut()], Refused()),
        "two heads": ([Say(HEAD), Say(BodyChunk(b"a")), Say(HEAD), Say(END)], CutOff(200, b"a")),
        "a whole response after the head": ([Say(HEAD), Say(BodyChunk(b"a")), Say(OK)], CutOff(200, b"a")),
        "a WebSocket message mid-body": (
            [Say(HEAD), Say(BodyChunk(b"a")), Say(WebSocketMessage({"type": "websocket.close"})), Say(END)],
            CutOff(200, b"a"),
        ),
        "a frame of no kind mid-body": ([Say(HEAD), Say(BodyChunk(b"a")), Frame(99)], CutOff(200, b"a")),
        "the channel closed mid-body": ([Say(HEAD), Say(BodyChunk(b"a")), Cut()], CutOff(200, b"a")),
        "a chunk that does not decode mid-body": (
            [Say(HEAD), Say(BodyChunk(b"a")), Frame(Kind.ITEM, b"junk"), Say(END)],
            CutOff(200, b"a"),
        ),
        "more body than its declared length (whole)": (
            [Say(HTTPResponse(200, _length(3), b"four"))],
            Refused(),
        ),
        "less body than its declared length (whole)": (
            [Say(HTTPResponse(200, _length(5), b"four"))],
            Refused(),
        ),
        "more body than its declared length (stream)": (
            [Say(HTTPResponseStart(200, _length(3))), Say(BodyChunk(b"ab")), Say(BodyChunk(b"cd")), Say(END)],
            CutOff(200, b"ab", 3),
        ),
        "its declared length met, then a wrong message": (
            [Say(HTTPResponseStart(200, _length(2))), Say(BodyChunk(b"ab")), Say(StreamItem(0))],
            CutOff(200, b"ab", 2),
        ),
        "less body than its declared length (stream)": (
            [Say(HTTPResponseStart(200, _length(5))), Say(BodyChunk(b"ab")), Say(END)],
            CutOff(200, b"ab", 5),
        ),
        "a body to a 204": ([Say(HTTPResponse(204, [], b"x"))], Refused()),
        "a chunk of a 304's stream": (
            [Say(HTTPResponseStart(304, [])), Say(BodyChunk(b"x")), Say(END)],
            CutOff(304, b"", 0),  # its head is the whole response
        ),
        "an empty 204, valid": ([Say(HTTPResponse(204, [], b""))], Whole(204, b"")),
        "upper-case names, valid": (
            [Say(HTTPResponse(200, [(b"X-Upper", b"v"), (b"Content-Length", b"2")], b"ok"))],
            Whole(200, b"ok"),
        ),
        "frames after the end, ignored": (
            [Say(OK), Say(END), Say(BodyChunk(b"late")), Say(OK), Frame(Kind.CREDIT, bytes(8))],
            Whole(200, b"fine"),
        ),
        "a duplicate end, ignored": ([Say(HEAD), Say(BodyChunk(b"a")), Say(END), Say(END)], Whole(200, b"a")),
        "an answer for a request nobody sent, ignored": (
            [Misnumbered(HTTPResponse(500, [], b"no")), Misnumbered(BodyChunk(b"x")), Say(OK)],
            Whole(200, b"fine"),
        ),
        "a huge whole response": ([Say(HTTPResponse(200, _length(len(HUGE)), HUGE))], Whole(200, HUGE)),
        "a huge chunk": ([Say(HEAD), Say(BodyChunk(HUGE)), Say(END)], Whole(200, HUGE)),
        "a huge chunk before the head": ([Say(BodyChunk(HUGE)), Say(HEAD), Say(END)], Refused()),
    }
    for name, (status, headers) in _bad_heads().items():
        whole = HTTPResponse(status, headers, b"")  # type: ignore[arg-type]  # what a faulty replica sends
        start = HTTPResponseStart(status, headers)  # type: ignore[arg-type]
        cases[f"whole: {name}"] = ([Say(whole)], Refused())
        cases[f"stream: {name}"] = ([Say(start), Say(BodyChunk(b"x")), Say(END)], Refused())
    return cases


NAMED = _named()


@pytest.mark.parametrize("name", list(NAMED))
def test_a_wrong_sequence_is_a_502_or_a_cut_and_the_proxy_keeps_serving(harness: Harness, name: str) -> None:
    steps, expected = NAMED[name]
    run_case(harness, steps, expected)


def test_a_message_under_another_requests_number(harness: Harness) -> None:
    """Another request's number on a head, or on an end its declared length forbids: that
    request is cut off (a well-formed chunk under the wrong number cannot be told from its
    own: the channel trusts the replica's numbering)."""
    for victim_head, meddling in (
        (HEAD, HTTPResponseStart(200, [])),
        (HTTPResponseStart(200, _length(4)), END),
    ):
        harness.cases += 1
        victim, meddler = f"v{harness.cases}", f"m{harness.cases}"
        harness.call(harness.tables.republish)
        fake = harness.fake
        fake.scripts[victim] = [
            Say(victim_head),
            Say(BodyChunk(b"ab")),
            Await(meddler),
            Say(BodyChunk(b"cd")),
        ]
        fake.scripts[meddler] = [Misnumbered(meddling, victim), Signal(meddler), Say(OK)]
        with LogRecords() as logs, Client(harness.port, f"/fuzz/{victim}") as hurt:
            assert hurt.read(until_data=True).body == b"ab"
            with Client(harness.port, f"/fuzz/{meddler}") as meddling_client:
                check(meddling_client.read(), Whole(200, b"fine"))
            check(hurt.read(), CutOff(200, b"abcd"))
        assert not logs.tracebacks(), logs.tracebacks()


# ------------------------------------------------------------------ generated sequences

_STATUSES = st.sampled_from([200, 201, 404, 503])
_CHUNKS = st.lists(st.binary(min_size=0, max_size=5), max_size=3)
_WRONG: st.SearchStrategy[Step] = st.sampled_from(
    [
        Say(HEAD),
        Say(OK),
        Say(CallResult(0)),
        Say(StreamItem(0)),
        Say(WebSocketMessage({"type": "websocket.send", "bytes": b"w"})),
        Say(CallFailure("E", "e", None)),
        Frame(99),
        Frame(Kind.RESPONSE, b"junk"),
        Cut(),
    ]
)


def _first(wrong: Step) -> Outcome:
    """What the client gets when ``wrong`` is the replica's first message."""
    if wrong == Say(OK):
        return Whole(200, b"fine")
    if wrong == Say(HEAD):  # a valid head: what follows it is the wrong part
        return CutOff(200, b"")
    return Refused()


@st.composite
def sequences(draw: st.DrawFn) -> tuple[list[Step], Outcome]:
    """A reply, maybe with a wrong message at some place, maybe declaring a length its
    body does not have; and what the client must get."""
    status = draw(_STATUSES)
    chunks = draw(_CHUNKS)
    body = b"".join(chunks)
    declared = draw(st.sampled_from([None, len(body), len(body) + 1, max(len(body) - 1, 0)]))
    headers = _length(declared) if declared is not None else []
    fits = declared in (None, len(body))
    wrong = draw(st.none() | _WRONG)
    trailing: list[Step] = draw(
        st.lists(st.sampled_from([Say(END), Say(BodyChunk(b"z")), Say(OK)]), max_size=2)
    )
    if draw(st.booleans()):  # a whole response
        whole: list[Step] = [Say(HTTPResponse(status, headers, body)), *trailing]
        if wrong is not None:  # before the response: it is the first answer
            return [wrong, *whole], _first(wrong)
        return whole, Whole(status, body) if fits else Refused()
    steps: list[Step] = [
        Say(HTTPResponseStart(status, headers)),
        *(Say(BodyChunk(c)) for c in chunks),
        Say(END),
    ]
    within = body if declared is None else body[:declared]  # what may go out
    if wrong is None:
        expected: Outcome = Whole(status, body) if fits else CutOff(status, within, declared)
        return steps + trailing, expected
    at = draw(st.integers(0, len(chunks) + 1))
    if at == 0:  # before the head
        return [wrong, *steps, *trailing], _first(wrong)
    sent = b"".join(chunks[: at - 1])
    return [*steps[:at], wrong, *steps[at:], *trailing], CutOff(status, sent[: len(within)], declared)


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    derandomize=True,
)
@given(case=sequences())
def test_generated_sequences(harness: Harness, case: tuple[list[Step], Outcome]) -> None:
    steps, expected = case
    run_case(harness, steps, expected)
