"""Reading request bodies within the proxy's bounds (size, budget, stalls)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
from starlette.types import Message

from app_toolkit._runtime.answers import header_dict
from app_toolkit._runtime.backends.ray.direct import StreamedBody
from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.channel.flow import STREAM_WINDOW, frame_cost
from app_toolkit._runtime.front.body import (
    READ_AHEAD_BYTES,
    Body,
    BodyBudget,
    BodyPump,
    read_body,
)
from app_toolkit._runtime.front.cycle import CLIENT_CLOSED, HTTPCycle
from app_toolkit._runtime.front.request_link import RequestLink
from app_toolkit._runtime.messages import BUSY, HTTPRequest, HTTPResponse, RequestBodyPiece
from app_toolkit.config import HTTPOptions


async def _no_send(message: Message) -> None:
    raise AssertionError(f"nothing is sent here: {message}")


pytestmark = pytest.mark.anyio

HTTP = HTTPOptions(max_request_body_bytes=100, max_buffered_body_bytes=150, body_timeout_s=0.2)


class _Link:
    """What our HTTP protocol says of the next piece: here already, or not."""

    def __init__(self, ready: bool) -> None:
        self.ready = ready

    def body_ready(self) -> bool:
        return self.ready


ARRIVED: Any = _Link(ready=True)


def chunks(*parts: bytes, then_stall: bool = False) -> Callable[[], Awaitable[dict[str, Any]]]:
    pending = list(parts)

    async def receive() -> dict[str, Any]:
        if not pending:
            if then_stall:
                await asyncio.sleep(60)
            return {"type": "http.disconnect"}
        part = pending.pop(0)
        return {"type": "http.request", "body": part, "more_body": bool(pending) or then_stall}

    return receive


async def test_declared_bodies_are_counted_up_front_and_given_back() -> None:
    budget = BodyBudget(HTTP.max_buffered_body_bytes)
    first = await read_body(chunks(b"a" * 80), b"80", HTTP, budget)
    assert first.data == b"a" * 80 and first.held == 80 and budget.held == 80
    second = await read_body(chunks(b"b" * 80), b"80", HTTP, budget)
    assert second.refusal == 503 and budget.held == 80  # nothing read, nothing taken
    assert second.answer(HTTP, "rid").status == 503
    assert ("retry-after", "1") in header_dict(second.answer(HTTP, "rid")).items()
    budget.give(first.held)
    assert budget.held == 0


async def test_bodies_without_a_length_are_counted_as_they_arrive() -> None:
    budget = BodyBudget(HTTP.max_buffered_body_bytes)
    budget.take(100)
    body = await read_body(chunks(b"x" * 30, b"y" * 30), None, HTTP, budget, ARRIVED)
    assert body.refusal == 503 and body.held == 30  # the caller gives back what was taken
    budget.give(body.held)
    assert budget.held == 100


async def test_too_large_stalled_and_abandoned_bodies() -> None:
    budget = BodyBudget(HTTP.max_buffered_body_bytes)
    assert (await read_body(chunks(b""), b"101", HTTP, budget)).refusal == 413
    assert (await read_body(chunks(b"z" * 60, b"z" * 60), None, HTTP, budget, ARRIVED)).refusal == 413
    stalled = await read_body(chunks(then_stall=True), b"50", HTTP, budget)  # nothing comes
    assert stalled.refusal == 408 and "0.2 s (body_timeout_s)" in stalled.answer(HTTP, "r").body.decode()
    assert (await read_body(chunks(), None, HTTP, budget)).refusal == CLIENT_CLOSED


async def test_what_has_not_arrived_is_left_for_the_pump() -> None:
    budget = BodyBudget(HTTP.max_buffered_body_bytes)
    # The next piece is not here yet: forward with what came (the rest streams).
    not_yet = cast(RequestLink, _Link(ready=False))  # a stand-in with the one member read_body uses
    body = await read_body(chunks(b"ab", b"cd"), None, HTTP, budget, not_yet)
    assert (body.data, body.more, body.refusal) == (b"ab", True, 0)
    # Under a server without our protocol's link, the first piece alone.
    body = await read_body(chunks(b"ab", b"cd"), None, HTTP, budget)
    assert (body.data, body.more) == (b"ab", True)
    # Pieces that are here are read, until the whole body or READ_AHEAD_BYTES.
    body = await read_body(chunks(b"ab", b"cd"), None, HTTP, budget, ARRIVED)
    assert (body.data, body.more) == (b"abcd", False)
    large = HTTPOptions(max_request_body_bytes=1 << 20)
    piece = b"p" * (READ_AHEAD_BYTES // 2)
    body = await read_body(chunks(piece, piece, piece), None, large, BodyBudget(1 << 20), ARRIVED)
    assert (len(body.data), body.more) == (READ_AHEAD_BYTES, True)
    # A declared length takes only what read-ahead may hold from the budget.
    declared = await read_body(chunks(piece, then_stall=True), b"1000000", large, BodyBudget(1 << 20))
    assert (declared.held, declared.more) == (READ_AHEAD_BYTES, True)


def test_the_budget_must_hold_what_the_proxy_reads_of_one_body() -> None:
    with pytest.raises(ValueError, match="max_buffered_body_bytes must be at least 100 bytes"):
        HTTPOptions(max_request_body_bytes=100, max_buffered_body_bytes=99)
    with pytest.raises(ValueError, match="at least 1048576 bytes"):
        HTTPOptions(max_request_body_bytes=1 << 30, max_buffered_body_bytes=(1 << 20) - 1)
    # Bodies stream past their first 64 KiB: a 2 GiB limit needs no 2 GiB budget.
    assert HTTPOptions(max_request_body_bytes=2 << 30).max_buffered_body_bytes == 1 << 30


# The direct path: the app reads the body as it arrives, within the same bounds.


def _streamed(receive: Callable[[], Awaitable[dict[str, Any]]], link: object = None) -> StreamedBody:
    state = HTTPCycle(_no_send, None, 0.0)
    state.link = link  # type: ignore[assignment]
    return StreamedBody(receive, HTTP, state)


async def test_a_streamed_body_passes_its_pieces_through() -> None:
    body = _streamed(chunks(b"ab", b"cd"))
    first, second = await body.receive(), await body.receive()
    assert (first["body"], first["more_body"], second["body"], second["more_body"]) == (
        b"ab",
        True,
        b"cd",
        False,
    )
    assert body.refusal == 0


async def test_a_streamed_body_over_the_limit_ends_with_a_disconnect_and_413() -> None:
    body = _streamed(chunks(b"x" * 60, b"x" * 60))
    assert (await body.receive())["type"] == "http.request"
    assert (await body.receive())["type"] == "http.disconnect"
    assert body.refusal == 413
    assert (await body.receive())["type"] == "http.disconnect"  # and it stays refused


async def test_a_stalled_streamed_body_ends_with_a_disconnect_and_408() -> None:
    body = _streamed(chunks(b"ab", then_stall=True))
    await body.receive()
    started = asyncio.get_running_loop().time()
    assert (await body.receive())["type"] == "http.disconnect"
    assert body.refusal == 408
    assert asyncio.get_running_loop().time() - started < 5


async def test_a_piece_that_has_arrived_is_read_without_a_timer() -> None:
    # The protocol says the piece is there: nothing to bound (a slow receive here is
    # only this test's, to show no timeout applies).
    async def slow_receive() -> dict[str, Any]:
        await asyncio.sleep(0.3)  # longer than body_timeout_s
        return {"type": "http.request", "body": b"ab", "more_body": False}

    body = _streamed(slow_receive, _Link(ready=True))
    assert (await body.receive())["body"] == b"ab"
    stalled = _streamed(slow_receive, _Link(ready=False))
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


async def test_the_pump_sends_nothing_before_the_replica_admits_the_request() -> None:
    read = Body(b"ab", more=True)
    # Refused: the pump ends without reading, so the next replica gets the body whole.
    refused, sent, _ = _pumped()
    pending = chunks(b"cd")
    async with BodyPump(pending, read, HTTP, HTTPCycle(_no_send, None, 0.0)) as pump:
        pump.start(refused)
        await _settle()
        refused.push(BUSY)
        await _settle()
    assert sent == [] and (await pending())["body"] == b"cd"  # still with the client
    # Admitted (its first credit): the rest of the body follows, the last piece says so.
    admitted, sent, _ = _pumped()
    async with BodyPump(chunks(b"cd", b"ef"), read, HTTP, HTTPCycle(_no_send, None, 0.0)) as pump:
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
    async with BodyPump(
        chunks(*[piece] * 6), Body(b"", more=True), large, HTTPCycle(_no_send, None, 0.0)
    ) as pump:
        pump.start(exchange)
        exchange.credited(STREAM_WINDOW)
        await _settle()
        assert len(sent) == 2  # a window's worth, not consumed yet
        exchange.credited(2 * frame_cost(len(piece)))  # the replica consumed both
        await _settle()
        assert len(sent) == 4


async def test_the_pump_answers_a_body_over_the_limit_or_stalled_in_the_apps_place() -> None:
    for receive, status in ((chunks(b"x" * 99), 413), (chunks(b"x", then_stall=True), 408)):
        exchange, sent, cancelled = _pumped()
        state = HTTPCycle(_no_send, None, 0.0)
        state.request_id = "rid"
        async with BodyPump(receive, Body(b"ab", more=True), HTTP, state) as pump:
            pump.start(exchange)
            exchange.credited(STREAM_WINDOW)
            answer = await asyncio.wait_for(exchange.recv(), 5)
        assert isinstance(answer, HTTPResponse) and answer.status == status
        assert cancelled == ["cancel"] and not state.uploading  # the replica stops the app
        assert header_dict(answer)["x-request-id"] == "rid"
