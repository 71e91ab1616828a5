"""/-/dashboard/events on both backends: the state the page draws, read as a real SSE
client; and the bound on how many pages may stream at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

import httpx

from app_toolkit._runtime.front.dashboard import MAX_VIEWERS
from tests.apps import basic
from tests.conftest import Toolkit


async def _state_until(
    client: httpx.AsyncClient, done: Callable[[dict[str, Any]], bool], timeout_s: float
) -> dict[str, Any]:
    """Read the stream until a state satisfies ``done``; returns it."""
    seen: dict[str, Any] = {}
    async with asyncio.timeout(timeout_s), client.stream("GET", "/-/dashboard/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                seen = json.loads(line[6:])
                if done(seen):
                    return seen
    raise AssertionError(f"the stream ended; last state: {seen}")


def _app(state: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((app for app in state["applications"] if app["name"] == name), None)


def test_the_stream_shows_applications_replicas_and_route_rates(toolkit: Toolkit) -> None:
    shop, other = toolkit.name(), toolkit.name()
    toolkit.run(basic.make_app(num_replicas=2), name=shop, route_prefix="/d-shop")
    toolkit.run(basic.make_app(), name=other, route_prefix="/d-other")
    route = "/d-shop/items/{item_id}"

    def complete(state: dict[str, Any]) -> bool:
        apps = [_app(state, shop), _app(state, other)]
        running = [
            sum(r["state"] == "RUNNING" for d in app["deployments"] for r in d["replicas"]) if app else 0
            for app in apps
        ]
        rows = [r for r in state["routes"] if r["application"] == shop and r["route"] == route]
        return running == [2, 1] and bool(rows) and rows[0]["total"] >= 40 and rows[0]["rate"] > 0

    async def scenario() -> dict[str, Any]:
        async with toolkit.async_client() as client:

            async def load() -> None:
                for i in range(400):
                    assert (await client.get(f"/d-shop/items/{i}")).status_code == 200
                    await asyncio.sleep(0.01)

            loader = asyncio.ensure_future(load())
            try:
                return await _state_until(client, complete, 30)
            finally:
                loader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loader

    state = asyncio.run(scenario())
    assert state["controller"] == ""
    (row,) = [r for r in state["routes"] if r["application"] == shop and r["route"] == route]
    assert row["p50_ms"] is not None and 0 < row["p50_ms"] <= row["p99_ms"] < 5000
    deployment = _app(state, shop)["deployments"][0]  # type: ignore[index]
    assert deployment["name"] == "Ingress" and deployment["target_replicas"] == 2
    # Ongoing requests come from this node's metrics: both backends run the replicas here.
    assert all(r["ongoing"] is not None for r in deployment["replicas"])
    assert not any(r["route"].startswith("/-/") for r in state["routes"])


def test_open_pages_are_bounded_and_a_closed_one_frees_its_place(toolkit: Toolkit) -> None:
    async def scenario() -> None:
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(toolkit.async_client())
            streams: list[httpx.Response] = []
            for _ in range(MAX_VIEWERS):
                streams.append(await stack.enter_async_context(client.stream("GET", "/-/dashboard/events")))
                assert streams[-1].status_code == 200
            refused = await client.get("/-/dashboard/events")
            assert refused.status_code == 503 and refused.headers["retry-after"]
            await streams[0].aclose()

            async def admitted() -> bool:
                async with client.stream("GET", "/-/dashboard/events") as response:
                    return response.status_code == 200

            async with asyncio.timeout(10):
                while not await admitted():
                    await asyncio.sleep(0.1)

    asyncio.run(scenario())
