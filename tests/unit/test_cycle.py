"""The request's one control flow (``HTTPCycle.run``), driven with stand-in upstreams: a
body refused while it was pumped, a client that leaves, a deadline, a cancellation from
elsewhere — what the client gets and what the request's record says."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from starlette.types import Message

from app_toolkit._runtime.front.body import CLIENT_CLOSED
from app_toolkit._runtime.front.cycle import FrontRules, HTTPCycle
from app_toolkit._runtime.front.path_match import AppMatcher
from app_toolkit._runtime.front.request_link import REQUEST_LINK
from app_toolkit._runtime.inprocess import MemoryLink
from app_toolkit._runtime.messages import DeploymentID, RouteInfo
from app_toolkit._runtime.request_keys import SHARD_KEY_HEADER
from app_toolkit.config import HTTPOptions
from tests.unit.scopes import http_scope

pytestmark = pytest.mark.anyio

ROUTE = AppMatcher(RouteInfo("/app", "app", DeploymentID("app", "Ingress")))
Serve = Callable[[HTTPCycle], Awaitable[None]]


class Upstream:
    """Serves each request with ``serve`` (the test's stand-in for a replica)."""

    def __init__(self, serve: Serve) -> None:
        self._serve = serve

    async def http(self, cycle: HTTPCycle) -> None:
        await self._serve(cycle)


class Request:
    """One request through a cycle: what was sent to the client, and whether its
    connection was cut off."""

    def __init__(self, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.sent: list[Message] = []
        self.cut_off = 0
        self.link = MemoryLink(lambda: False, self._cut)
        self.scope = {**http_scope("/app/x", headers=headers), REQUEST_LINK: self.link}
        self.cycle: HTTPCycle | None = None

    def _cut(self) -> None:
        self.cut_off += 1

    async def run(self, serve: Serve) -> HTTPCycle:
        async def receive() -> Message:
            await asyncio.sleep(60)
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            self.sent.append(message)

        rules = FrontRules(HTTPOptions(), SHARD_KEY_HEADER, None)
        self.cycle = HTTPCycle(self.scope, receive, send, rules, ROUTE, "/app/x")
        await self.cycle.run(Upstream(serve))
        return self.cycle

    @property
    def status(self) -> int | None:
        heads = [m for m in self.sent if m["type"] == "http.response.start"]
        return int(heads[0]["status"]) if heads else None

    def body(self) -> Any:
        return json.loads(
            b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        )


async def _refused_while_waiting(cycle: HTTPCycle, status: int) -> None:
    """A replica that never answers, and a pump that refuses the body meanwhile."""

    async def refuse() -> None:
        await asyncio.sleep(0.01)
        cycle.reader.refusal = status
        cycle.stop_for_body()

    pump = asyncio.ensure_future(refuse())
    try:
        await asyncio.sleep(30)
    finally:
        await pump


async def test_a_body_refused_while_pumped_is_answered_in_the_apps_place() -> None:
    for status, words in ((413, "max_request_body_bytes"), (408, "body_timeout_s")):
        request = Request()
        cycle = await asyncio.wait_for(
            request.run(functools.partial(_refused_while_waiting, status=status)), 5
        )
        assert request.status == status and cycle.status == status and request.cut_off == 0
        assert words in request.body()["detail"]
        assert dict(request.sent[0]["headers"])[b"x-request-id"] == cycle.request_id.encode()


async def test_a_body_refused_after_the_head_went_out_cuts_the_response_off() -> None:
    async def streams_then_waits(cycle: HTTPCycle) -> None:
        await cycle.stream(200, [], "/x", b"first")
        await _refused_while_waiting(cycle, 413)

    request = Request()
    cycle = await asyncio.wait_for(request.run(streams_then_waits), 5)
    assert request.status == 200 and request.cut_off == 1  # never taken for a whole response
    assert cycle.finished and cycle.status == 200


async def test_a_client_that_leaves_makes_the_request_a_499_and_cancels_it() -> None:
    reached: list[str] = []

    async def waits(cycle: HTTPCycle) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            reached.append("cancelled")
            raise

    request = Request()
    running = asyncio.ensure_future(request.run(waits))
    await asyncio.sleep(0.01)
    assert request.link.on_client_left is not None
    request.link.on_client_left()  # the server heard the connection end
    cycle = await asyncio.wait_for(running, 5)
    assert reached == ["cancelled"] and request.sent == [] and cycle.status == CLIENT_CLOSED
    assert request.link.on_client_left is None  # unhooked once the request ended


async def test_a_passed_deadline_is_504_and_a_bad_one_400() -> None:
    async def slow(cycle: HTTPCycle) -> None:
        await asyncio.sleep(30)

    request = Request([(b"x-request-timeout-seconds", b"0.05")])
    await asyncio.wait_for(request.run(slow), 5)
    assert request.status == 504 and "0.05 s" in request.body()["detail"]
    bad = Request([(b"x-request-timeout-seconds", b"soon")])
    await asyncio.wait_for(bad.run(slow), 5)
    assert bad.status == 400 and "x-request-timeout-seconds" in bad.body()["detail"]


async def test_a_declared_body_over_the_limit_is_413_before_any_upstream_runs() -> None:
    async def never(cycle: HTTPCycle) -> None:
        raise AssertionError("no upstream runs for a body declared too large")

    request = Request([(b"content-length", str(HTTPOptions().max_request_body_bytes + 1).encode())])
    await asyncio.wait_for(request.run(never), 5)
    assert request.status == 413


async def test_a_cancellation_from_elsewhere_goes_on_up_even_with_the_clients() -> None:
    async def waits(cycle: HTTPCycle) -> None:
        await asyncio.sleep(30)

    for client_leaves_too in (False, True):
        request = Request()
        running = asyncio.ensure_future(request.run(waits))
        await asyncio.sleep(0.01)
        running.cancel()  # the server stopping
        if client_leaves_too:
            assert request.link.on_client_left is not None
            request.link.on_client_left()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert request.cycle is not None and request.link.on_client_left is None


async def test_a_client_gone_after_a_whole_response_leaves_its_status() -> None:
    async def answers_then_reads(cycle: HTTPCycle) -> None:
        await cycle.whole(200, [], b"{}", "/x")
        cycle.reader.refusal = CLIENT_CLOSED  # the app read on after answering; the client left

    request = Request()
    cycle = await asyncio.wait_for(request.run(answers_then_reads), 5)
    assert request.status == 200 and cycle.status == 200
