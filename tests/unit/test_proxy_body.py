"""Reading request bodies within the front's bounds (size, budget, stalls), through the
request's one reader: read ahead, pumped to a replica, or read by an app in its replica."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from app_toolkit._runtime.answers import header_dict
from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.channel.flow import STREAM_WINDOW, frame_cost
from app_toolkit._runtime.front.body import (
    CLIENT_CLOSED,
    READ_AHEAD_BYTES,
    Body,
    BodyBudget,
    BodyPump,
    BodyReader,
    declared_too_large,
    read_ahead,
    refusal_answer,
)
from app_toolkit._runtime.messages import BUSY, HTTPRequest, RequestBodyPiece
from app_toolkit.config import HTTPOptions

pytestmark = pytest.mark.anyio

HTTP = HTTPOptions(max_request_body_bytes=100, max_buffered_body_bytes=150, body_timeout_s=0.2)


class _Link:
    """What the server says of the next piece: here already, or not."""

    def __init__(self, ready: bool) -> None:
        self.ready = ready

    def body_ready(self) -> bool:
        return self.ready


ARRIVED: Any = _Link(ready=True)
NOT_YET: Any = _Link(ready=False)
Receive = Callable[[], Awaitable[dict[str, Any]]]


def chunks(*parts: bytes, then_stall: bool = False) -> Receive:
    pending = list(parts)

    async def receive() -> dict[str, Any]:
        if not pending:
            if then_stall:
                await asyncio.sleep(60)
            return {"type": "http.disconnect"}
        part = pending.pop(0)
        return {"type": "http.request", "body": part, "more_body": bool(pending) or then_stall}

    return receive


def reader(receive: Receive, link: Any = NOT_YET, http: HTTPOptions = HTTP) -> BodyReader:
    return BodyReader(receive, http, link)


async def _ahead(
    receive: Receive,
    length: bytes | None,
    budget: BodyBudget,
    link: Any = NOT_YET,
    http: HTTPOptions = HTTP,
) -> tuple[Body, int]:
    """What read-ahead made of a body: the body, and its refusal (0: none)."""
    body, read = Body(), reader(receive, link, http)
    await read_ahead(body, read, link, length, budget)
    return body, read.refusal


async def test_declared_bodies_are_counted_up_front_and_given_back() -> None:
    budget = BodyBudget(HTTP.max_buffered_body_bytes)
    first, refused = await _ahead(chunks(b"a" * 80), b"80", budget)
    assert (first.data, first.held, refused, budget.held) == (b"a" * 80, 80, 0, 80)
    second, refused = await _ahead(chunks(b"b" * 80), b"80", budget)
    assert refused == 503 and second.held == 0 and budget.held == 80  # nothing read, nothing taken
    answer = refusal_answer(refused, HTTP, "rid")
    assert answer.status == 503 and ("retry-after", "1") in header_dict(answer).items()
    budget.give(first.held)
    assert budget.held == 0


async def test_bodies_without_a_length_are_counted_as_they_arrive() -> None:
    budget = BodyBudget(HTTP.max_buffered_body_bytes)
    budget.take(100)
    body, refused = await _ahead(chunks(b"x" * 30, b"y" * 30), None, budget, ARRIVED)
    assert refused == 503 and body.held == 30  # the caller gives back what was taken
    budget.give(body.held)
    assert budget.held == 100


async def test_too_large_stalled_and_abandoned_bodies() -> None:
    budget = BodyBudget(HTTP.max_buffered_body_bytes)
    assert declared_too_large(b"101", HTTP) and not declared_too_large(b"100", HTTP)
    assert not declared_too_large(b"1e9", HTTP)  # not a length: read, and counted as it comes
    assert (await _ahead(chunks(b"z" * 60, b"z" * 60), None, budget, ARRIVED))[1] == 413
    stalled = await _ahead(chunks(then_stall=True), b"50", budget)  # nothing comes
    assert stalled[1] == 408 and "0.2 s (body_timeout_s)" in refusal_answer(408, HTTP, "r").body.decode()
    assert (await _ahead(chunks(), None, budget))[1] == CLIENT_CLOSED


async def test_what_has_not_arrived_is_left_for_the_pump() -> None:
    budget = BodyBudget(HTTP.max_buffered_body_bytes)
    # The next piece is not here yet: forward with what came (the rest streams).
    body, refused = await _ahead(chunks(b"ab", b"cd"), None, budget, NOT_YET)
    assert (body.data, body.more, refused) == (b"ab", True, 0)
    # Pieces that are here are read, until the whole body or READ_AHEAD_BYTES.
    body, _ = await _ahead(chunks(b"ab", b"cd"), None, budget, ARRIVED)
    assert (body.data, body.more) == (b"abcd", False)
    large = HTTPOptions(max_request_body_bytes=1 << 20)
    piece = b"p" * (READ_AHEAD_BYTES // 2)
    body, _ = await _ahead(chunks(piece, piece, piece), None, BodyBudget(1 << 20), ARRIVED, large)
    assert (len(body.data), body.more) == (READ_AHEAD_BYTES, True)
    # A declared length takes only what read-ahead may hold from the budget.
    declared, _ = await _ahead(
        chunks(piece, then_stall=True), b"1000000", BodyBudget(1 << 20), NOT_YET, large
    )
    assert (declared.held, declared.more) == (READ_AHEAD_BYTES, True)


def test_the_budget_must_hold_what_the_proxy_reads_of_one_body() -> None:
    with pytest.raises(ValueError, match="max_buffered_body_bytes must be at least 100 bytes"):
        HTTPOptions(max_request_body_bytes=100, max_buffered_body_bytes=99)
    with pytest.raises(ValueError, match="at least 1048576 bytes"):
        HTTPOptions(max_request_body_bytes=1 << 30, max_buffered_body_bytes=(1 << 20) - 1)
    # Bodies stream past their first 64 KiB: a 2 GiB limit needs no 2 GiB budget.
    assert HTTPOptions(max_request_body_bytes=2 << 30).max_buffered_body_bytes == 1 << 30


# The direct path: the app reads the body as it arrives, within the same bounds.


async def test_an_apps_read_passes_the_pieces_through() -> None:
    body = reader(chunks(b"ab", b"cd"))
    first, second = await body.receive(), await body.receive()
    assert (first["body"], first["more_body"], second["body"], second["more_body"]) == (
        b"ab",
        True,
        b"cd",
        False,
    )
    assert body.refusal == 0 and body.done


async def test_an_apps_read_over_the_limit_ends_with_a_disconnect_and_413() -> None:
    body = reader(chunks(b"x" * 60, b"x" * 60))
    assert (await body.receive())["type"] == "http.request"
    assert (await body.receive())["type"] == "http.disconnect"
    assert body.refusal == 413
    assert (await body.receive())["type"] == "http.disconnect"  # and it stays refused


async def test_a_stalled_body_ends_the_apps_read_with_a_disconnect_and_408() -> None:
    body = reader(chunks(b"ab", then_stall=True))
    await body.receive()
    started = asyncio.get_running_loop().time()
    assert (await body.receive())["type"] == "http.disconnect"
    assert body.refusal == 408
    assert asyncio.get_running_loop().time() - started < 5


async def test_a_piece_that_has_arrived_is_read_without_a_timer() -> None:
    # The link says the piece is there: nothing to bound (a slow receive here is
    # only this test's, to show no timeout applies).
    async def slow_receive() -> dict[str, Any]:
        await asyncio.sleep(0.3)  # longer than body_timeout_s
        return {"type": "http.request", "body": b"ab", "more_body": False}

    body = reader(slow_receive, ARRIVED)
    assert (await body.receive())["body"] == b"ab"
    stalled = reader(slow_receive, NOT_YET)
    assert (await stalled.receive())["type"] == "http.disconnect" and stalled.refusal == 408


# The proxied path: the rest of a body goes to the replica that admitted the request.


def _pumped() -> tuple[Exchange, list[RequestBodyPiece], list[str]]:
    sent: list[RequestBodyPiece] = []
    cancelled: list[str] = []

    def forward(message: object) -> int:
        assert isinstance(message, RequestBodyPiece)
        sent.append(message)
        return frame_cost(len(message.data))

    request = HTTPRequest("r", {}, b"ab", more_body=True)
    return Exchange(lambda: cancelled.append("cancel"), forward, request=request), sent, cancelled


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _never_stopped() -> None:
    raise AssertionError("the request is not stopped here")


async def test_the_pump_sends_nothing_before_the_replica_admits_the_request() -> None:
    # Refused: the pump ends without reading, so the next replica gets the body whole.
    refused, sent, _ = _pumped()
    pending = chunks(b"cd")
    async with BodyPump(reader(pending), _never_stopped) as pump:
        pump.start(refused)
        await _settle()
        refused.push(BUSY)
        await _settle()
    assert sent == [] and (await pending())["body"] == b"cd"  # still with the client
    # Admitted (its first credit): the rest of the body follows, the last piece says so.
    admitted, sent, _ = _pumped()
    async with BodyPump(reader(chunks(b"cd", b"ef")), _never_stopped) as pump:
        pump.start(admitted)
        await _settle()
        assert sent == []
        admitted.credited(STREAM_WINDOW)
        await _settle()
    assert sent == [RequestBodyPiece(b"cd", True), RequestBodyPiece(b"ef", False)]


async def test_the_pump_stays_a_window_ahead_of_the_app() -> None:
    exchange, sent, _ = _pumped()
    piece = b"w" * (STREAM_WINDOW // 2)
    large = HTTPOptions(max_request_body_bytes=1 << 30, max_buffered_body_bytes=1 << 30)
    async with BodyPump(reader(chunks(*[piece] * 6), http=large), _never_stopped) as pump:
        pump.start(exchange)
        exchange.credited(STREAM_WINDOW)
        await _settle()
        assert len(sent) == 2  # a window's worth, not consumed yet
        exchange.credited(2 * frame_cost(len(piece)))  # the replica consumed both
        await _settle()
        assert len(sent) == 4


async def _pump_until_stopped(receive: Receive) -> tuple[list[int], list[RequestBodyPiece], list[str]]:
    """Pump a body that breaks a bound: the refusals its request was stopped with, the
    pieces sent before, and the cancels of the exchange."""
    exchange, sent, cancelled = _pumped()
    stopped: list[int] = []
    body = BodyReader(receive, HTTP, NOT_YET)
    body.size = 2  # what read-ahead read of it
    async with BodyPump(body, lambda: stopped.append(body.refusal)) as pump:
        pump.start(exchange)
        exchange.credited(STREAM_WINDOW)
        for _ in range(100):
            if stopped:
                break
            await asyncio.sleep(0.01)
    return stopped, sent, cancelled


async def test_the_pump_stops_the_request_when_the_body_breaks_a_bound() -> None:
    # The request's cycle answers the refusal in the app's place (413, 408), once stopped;
    # its forward cancels the exchange, which tells the replica.
    stopped, sent, cancelled = await _pump_until_stopped(chunks(b"x" * 99))
    assert (stopped, sent, cancelled) == ([413], [], [])
    stopped, sent, cancelled = await _pump_until_stopped(chunks(b"x", then_stall=True))
    assert (stopped, sent, cancelled) == ([408], [RequestBodyPiece(b"x", True)], [])
