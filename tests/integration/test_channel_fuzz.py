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

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app_toolkit._runtime.channel.frames import Kind
from app_toolkit._runtime.messages import (
    END,
    BodyChunk,
    CallFailure,
    CallResult,
    Headers,
    HTTPResponse,
    HTTPResponseStart,
    StreamItem,
    WebSocketMessage,
)
from tests.integration.channel_fuzz_harness import (
    Await,
    Client,
    Cut,
    CutOff,
    Frame,
    Harness,
    LogRecords,
    Misnumbered,
    Outcome,
    Refused,
    Say,
    Signal,
    Step,
    Whole,
    check,
    run_case,
    started_harness,
)


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    with started_harness() as running:
        yield running


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
