"""``@continuable`` and a caller's continuation of a stream: which errors continue it
(a lost replica, one gone under it; never a slow one, a refusal or a cancellation), its
limit, its item and byte bounds (its own and its process's), the class it waits in, and
what the decorator refuses."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence

import pytest

import app_toolkit as tk
from app_toolkit._runtime.continuation_marks import continuations_of, continue_from_of
from app_toolkit._runtime.messages import DeploymentID, MethodCall, ReplicaInfo, StreamContinuation, StreamEnd
from app_toolkit._runtime.request_values import Share
from app_toolkit._runtime.routing import continuations
from app_toolkit._runtime.routing.choice import SUSPECT_S, ReplicaChooser
from app_toolkit._runtime.routing.continuations import CONTINUATION_CLASS, Continuation, _drop, sent_within
from app_toolkit._runtime.routing.replica_client import Reply
from app_toolkit.exceptions import (
    BackPressureError,
    ContinuationRefused,
    DefinitionError,
    ReplicaUnavailableError,
    RequestLostError,
    RequestTimeoutError,
)

DEPLOYMENT = DeploymentID("app", "Model")
LOST = RequestLostError("lost")


@pytest.fixture(autouse=True)
def _kept_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test counts the process's kept bytes from 0 (its streams never end)."""
    monkeypatch.setattr(continuations.KEPT, "used", 0)
    monkeypatch.setattr(continuations.KEPT, "warned_at", -continuations.FULL_WARNING_EVERY_S)


def _continuation(limit: int = 2, max_items: int = 5, max_bytes: int = 1000) -> Continuation:
    return Continuation(StreamContinuation("write", limit, max_items, 1.0, max_bytes), DEPLOYMENT)


def test_a_lost_replica_continues_the_stream_with_its_items_ahead_of_every_class() -> None:
    continuation = _continuation()
    for item in ("a", "b"):
        continuation.keep(item, 130)
    call = MethodCall("r1", "write", ("request",), share=Share("alice", 2.0, 5))
    after = continuation.after(LOST, call)
    assert after is not None
    assert after.continued == ("a", "b") and after.args == ("request",)
    assert after.share == Share("alice", 2.0, CONTINUATION_CLASS)  # the key's name and weight kept
    # A stream lost before its first item is sent again as it was (no items to continue from).
    fresh = _continuation().after(ReplicaUnavailableError("gone"), MethodCall("r2", "write", ("x",)))
    assert fresh is not None and fresh.continued is None and fresh.share == Share("", 1.0, CONTINUATION_CLASS)


@pytest.mark.parametrize(
    "error",
    [
        BackPressureError("app#Model", 10),  # refused, never started: the caller's own answer
        RequestTimeoutError("slow"),  # a slow replica is never continued elsewhere
        asyncio.CancelledError(),  # the caller left
        ValueError("the method raised"),
    ],
)
def test_other_errors_end_the_stream(error: BaseException) -> None:
    continuation = _continuation()
    continuation.keep("a", 130)
    assert continuation.after(error, MethodCall("r1", "write", ("request",))) is None


def test_the_limit_the_item_bound_and_a_continuation_no_replica_took_end_it() -> None:
    call = MethodCall("r1", "write", ("request",))
    limited = _continuation(limit=2)
    assert limited.after(LOST, call) is not None
    assert limited.after(LOST, call) is not None
    assert limited.after(LOST, call) is None
    bounded = _continuation(max_items=3)
    for item in range(3):
        bounded.keep(item, 130)
    assert bounded.after(LOST, call) is not None  # at the bound: kept
    bounded.keep(3, 130)
    assert bounded.after(LOST, call) is None
    # The items' bytes bound it too: three of 300 fit in 1,000, a fourth does not.
    heavy = _continuation(max_items=100, max_bytes=1000)
    for item in range(3):
        heavy.keep(item, 300)
    assert heavy.after(LOST, call) is not None
    heavy.keep(3, 300)
    assert heavy.after(LOST, call) is None
    waited = _continuation()
    waited.end()  # no replica took a continuation in time
    assert waited.after(LOST, call) is None
    # A replica that cannot continue it ends it (as the loss did), and so does a request
    # not given as the call's first argument (continue_from takes that).
    assert _continuation().after(ContinuationRefused("cannot"), call) is None
    assert _continuation().after(LOST, MethodCall("r1", "write", (), {"request": "x"})) is None


def test_the_process_bound_stops_keeping_and_what_a_stream_kept_is_given_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(continuations, "PROCESS_MAX_BYTES", 1000)
    call = MethodCall("r1", "write", ("request",))
    first, second = _continuation(max_items=100), _continuation(max_items=100)
    for item in range(3):
        first.keep(item, 300)
    assert continuations.KEPT.used == 900
    with caplog.at_level(logging.WARNING, logger="app_toolkit.router"):
        second.keep("a", 200)  # 1,100 in the process: the second stream is not continued
        _continuation().keep("b", 200)  # nor is another, said once a minute at most
    assert ["no longer continued" in record.getMessage() for record in caplog.records] == [True]
    assert second.after(LOST, call) is None and continuations.KEPT.used == 900
    assert first.after(LOST, call) is not None  # the first keeps its items
    first.release()  # it ended: what it kept is given back, once
    first.release()
    third = _continuation(max_items=100)
    third.keep("a", 200)
    assert continuations.KEPT.used == 200 and third.after(LOST, call) is not None
    third.end()  # no replica took it: its items go too
    assert continuations.KEPT.used == 0


class _Writer:
    @tk.continuable(lambda request, produced: f"{request}+{len(produced)}", limit=4, wait_s=9.0)
    async def write(self, request: str) -> AsyncIterator[str]:
        yield request

    async def plain(self, request: str) -> AsyncIterator[str]:
        yield request


def test_the_decorator_marks_generator_methods_and_the_build_reads_them() -> None:
    assert continuations_of(_Writer) == (StreamContinuation("write", 4, 65_536, 9.0, 16 << 20),)
    continue_from = continue_from_of(_Writer().write)  # read through the bound method
    assert continue_from is not None and continue_from("req", ["a", "b"]) == "req+2"
    assert continue_from_of(_Writer().plain) is None
    assert continuations_of(lambda: None) == ()


def _continue(request: object, produced: Sequence[object]) -> object:
    return request


def test_the_decorator_refuses_what_cannot_be_continued() -> None:
    with pytest.raises(DefinitionError, match="generator"):

        class _NotAStream:
            @tk.continuable(_continue)
            async def answer(self, request: str) -> str:
                return request

    with pytest.raises(DefinitionError, match="at least 1"):
        tk.continuable(_continue, limit=0)
    with pytest.raises(DefinitionError, match="max_bytes=0"):
        tk.continuable(_continue, max_bytes=0)
    with pytest.raises(DefinitionError, match="wait_s=inf"):
        tk.continuable(_continue, wait_s=float("inf"))
    with pytest.raises(DefinitionError, match="function"):
        tk.continuable("not a function")  # type: ignore[arg-type]


class _Exchange:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _reply(released: list[str]) -> Reply:
    return Reply(StreamEnd(), _Exchange(), "r", released.append, lambda _: LOST)  # type: ignore[arg-type]


Opened = Callable[[object], None]
Refused = Callable[[], None]


def test_a_continuation_waits_for_a_replica_to_take_it_not_for_its_answer() -> None:
    """``sent_within`` bounds the wait for a replica to take the call (open it, and not
    refuse it); once one holds it, the answer takes as long as it takes. None (the send
    stopped) when none took it in time, a busy replica's refusal included; a caller that
    leaves stops the send, and a reply that came as it left is given back."""

    async def scenario() -> None:
        released: list[str] = []

        async def never_opened(on_open: Opened, on_refused: Refused) -> Reply:
            await asyncio.sleep(10)
            raise AssertionError("not reached")

        assert await sent_within(never_opened, 0.05) is None  # type: ignore[arg-type]

        async def opened_then_slow(on_open: Opened, on_refused: Refused) -> Reply:
            on_open(object())
            await asyncio.sleep(0.2)  # longer than the wait: the replica took it
            return _reply(released)

        reply = await sent_within(opened_then_slow, 0.05)  # type: ignore[arg-type]
        assert reply is not None and released == []

        async def refused_then_queued(on_open: Opened, on_refused: Refused) -> Reply:
            on_open(object())
            on_refused()  # busy: it waits in the queue for another
            await asyncio.sleep(10)
            raise AssertionError("not reached")

        assert await sent_within(refused_then_queued, 0.05) is None  # type: ignore[arg-type]

        async def slow(on_open: Opened, on_refused: Refused) -> Reply:
            on_open(object())
            await asyncio.sleep(10)
            raise AssertionError("not reached")

        task = asyncio.ensure_future(sent_within(slow, 1.0))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        task.cancel()  # the caller left: the send stops
        with pytest.raises(asyncio.CancelledError):
            await task
        # A send that had its reply as it was stopped gives the reply back.
        done: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        done.set_result(_reply(released))
        _drop(done)
        assert released == ["r"]

    asyncio.run(scenario())


def test_a_refused_continuation_ends_the_stream_as_counted() -> None:
    continuation = _continuation()
    assert continuation.refused(ContinuationRefused("the engine cannot")) is True
    assert continuation.after(LOST, MethodCall("r1", "write", ("request",))) is None  # ended
    assert _continuation().refused(LOST) is False


def test_a_suspect_replica_is_skipped_for_a_while_its_requests_kept() -> None:
    chooser = ReplicaChooser()
    chooser.set_replicas([ReplicaInfo("a", DEPLOYMENT, "127.0.0.1", 1, b"t", 4)])
    chooser.acquire("a")
    chooser.suspect("a", now=100.0)
    assert chooser.choose(100.0 + SUSPECT_S - 0.1) is None
    chooser.release("a")  # its request under way still counts, and leaves
    assert chooser.choose(100.0 + SUSPECT_S) is not None
