"""Reading request bodies within the proxy's bounds (size, budget, stalls)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from app_toolkit._runtime.answers import header_dict
from app_toolkit._runtime.proxy.body import CLIENT_CLOSED, BodyBudget, read_body
from app_toolkit.config import HTTPOptions

pytestmark = pytest.mark.anyio

HTTP = HTTPOptions(max_request_body_bytes=100, max_buffered_body_bytes=150, body_timeout_s=0.2)


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
    body = await read_body(chunks(b"x" * 30, b"y" * 30), None, HTTP, budget)
    assert body.refusal == 503 and body.held == 30  # the caller gives back what was taken
    budget.give(body.held)
    assert budget.held == 100


async def test_too_large_stalled_and_abandoned_bodies() -> None:
    budget = BodyBudget(HTTP.max_buffered_body_bytes)
    assert (await read_body(chunks(b""), b"101", HTTP, budget)).refusal == 413
    assert (await read_body(chunks(b"z" * 60, b"z" * 60), None, HTTP, budget)).refusal == 413
    stalled = await read_body(chunks(b"z" * 10, then_stall=True), b"50", HTTP, budget)
    assert stalled.refusal == 408 and "0.2 s (body_timeout_s)" in stalled.answer(HTTP, "r").body.decode()
    assert (await read_body(chunks(), None, HTTP, budget)).refusal == CLIENT_CLOSED


def test_the_budget_must_hold_the_largest_body() -> None:
    with pytest.raises(ValueError, match="max_buffered_body_bytes must be at least"):
        HTTPOptions(max_request_body_bytes=100, max_buffered_body_bytes=99)
