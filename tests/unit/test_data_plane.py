"""The data plane owns its loop's work: calls from any thread, nothing left after close."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app_toolkit._runtime.routing.data_plane import DataPlane
from app_toolkit._runtime.tables import Loads, Updates, Versions
from app_toolkit.exceptions import ReplicaUnavailableError


class NoController:
    """A link for a data plane that never reaches a replica or a controller."""

    def connect(self, info: object) -> object:
        raise AssertionError("no replica in this test")

    async def listen(self, known: Versions, timeout_s: float) -> Updates:
        await asyncio.sleep(timeout_s)
        return {}

    async def report_load(self, caller: str, loads: Loads) -> None:
        return None


def test_work_from_other_threads_runs_on_its_loop_and_close_cancels_what_is_left() -> None:
    plane = DataPlane(NoController())  # type: ignore[arg-type]
    seen: list[threading.Thread] = []

    async def where() -> str:
        seen.append(threading.current_thread())
        return "here"

    assert plane.submit(where()).result(5) == "here"
    assert plane.run(where(), 5) == "here"
    assert seen[0] is seen[1] and seen[0] is not threading.current_thread()

    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    pending = plane.submit(forever())
    closed: list[str] = []
    plane.hold(lambda: closed.append("stream"))
    plane.close()
    assert cancelled.is_set() and pending.done() and closed == ["stream"]
    with pytest.raises(ReplicaUnavailableError, match="shut down"):
        plane.run(where())
