"""Nothing leaks: after 1,000 streams whose clients disconnected, no task or slot is left."""

from __future__ import annotations

import asyncio
import time

import httpx

import app_toolkit as tk
from app_toolkit._runtime.local_backend import LocalSession
from app_toolkit._runtime.session import current_session
from tests.apps import streams
from tests.conftest import Toolkit, _ensure_backend

STREAMS = 1000
CONCURRENCY = 25


def test_a_thousand_disconnected_streams_leave_nothing_behind() -> None:
    # The local backend runs proxy and replica on one event loop, so its task count covers
    # both; the Ray backend runs the same proxy, dispatcher and replica code.
    toolkit: Toolkit = _ensure_backend("local")
    name = toolkit.name()
    toolkit.run(streams.make_app(), name=name, route_prefix="/leak")
    session = current_session(create=False)
    assert isinstance(session, LocalSession)
    try:
        with toolkit.client() as client:  # warm up: connections, subscriber tasks
            assert client.get("/leak/events", params={"count": 1}).status_code == 200
        baseline = _task_count(session)

        async def open_and_drop(client: httpx.AsyncClient, count: int) -> None:
            for _ in range(count):
                async with client.stream("GET", "/leak/endless") as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data:"):
                            break  # read one event, then hang up

        async def load() -> None:
            async with httpx.AsyncClient(base_url=toolkit.url, timeout=30) as client:
                await asyncio.gather(*(open_and_drop(client, STREAMS // CONCURRENCY)
                                       for _ in range(CONCURRENCY)))

        asyncio.run(load())
        deadline = time.monotonic() + 20
        while True:
            ongoing = [core.ongoing for core in session.backend.cores.values()]
            tasks = _task_count(session)
            if tasks <= baseline and not any(ongoing):
                break
            assert time.monotonic() < deadline, f"{tasks - baseline} tasks and {ongoing} slots left"
            time.sleep(0.05)
    finally:
        tk.delete(name)


def _task_count(session: LocalSession) -> int:
    async def count() -> int:
        return len(asyncio.all_tasks())

    return int(session.run_blocking(count()))
