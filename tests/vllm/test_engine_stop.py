"""The order a vLLM engine closes in (``vllm_start.abort_and_stop``), against a stand-in
for vLLM's ``AsyncLLM``: its output handler ends first, then the open replies are aborted,
then the engine stops, then any stream still open ends with vLLM's engine-dead error —
that last step even when the abort or the stop fails, and on the loop the streams are
read on (the abort too)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest

from app_toolkit.llm.engines.vllm_start import abort_and_stop

pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::FutureWarning"
)  # vLLM's imports


class _Processor:
    def __init__(self, steps: list[str]) -> None:
        self.steps = steps
        self.threads: list[int] = []

    def propagate_error(self, error: Exception) -> None:
        self.threads.append(threading.get_ident())
        self.steps.append(f"fail streams: {type(error).__name__}")


class _Engine:
    """What ``abort_and_stop`` reads of vLLM's ``AsyncLLM``: its output handler (a task on
    the loop of the engine's first reply), its ``abort`` and its output processor."""

    def __init__(self, steps: list[str], abort_fails: bool = False) -> None:
        self.steps = steps
        self.abort_fails = abort_fails
        self.output_processor = _Processor(steps)
        self.output_handler: asyncio.Task[None] | None = None

    async def start_handler(self) -> None:
        """The handler started on the running loop, as vLLM starts it at the first reply."""
        self.output_handler = asyncio.create_task(self._handle())
        await asyncio.sleep(0)  # running: a cancellation reaches its body

    async def _handle(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.steps.append("handler cancelled")
            raise

    async def abort(self, request_ids: list[str]) -> None:
        self.steps.append(f"abort {request_ids}")
        self.output_processor.threads.append(threading.get_ident())
        if self.abort_fails:
            raise RuntimeError("abort failed")


def _stop(steps: list[str], fails: bool = False) -> Any:
    def stop() -> None:
        steps.append("stop")
        if fails:
            raise RuntimeError("stop failed")

    return stop


@pytest.fixture
def other_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop running in a thread of its own: the loop an engine's first reply came on."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    assert not thread.is_alive()
    loop.close()


def test_the_handler_ends_then_replies_abort_then_the_engine_stops_then_open_streams_fail() -> None:
    async def run() -> list[str]:
        steps: list[str] = []
        engine = _Engine(steps)
        await engine.start_handler()
        await abort_and_stop(cast(Any, engine), ["a", "b"], _stop(steps))
        assert engine.output_processor.threads == [threading.get_ident()] * 2  # the abort, the failing
        return steps

    assert asyncio.run(run()) == [
        "handler cancelled",
        "abort ['a', 'b']",
        "stop",
        "fail streams: EngineDeadError",
    ]


@pytest.mark.parametrize("failing", ["abort", "stop"])
def test_open_streams_fail_and_the_engine_stops_when_a_step_before_fails(failing: str) -> None:
    async def run() -> list[str]:
        steps: list[str] = []
        engine = _Engine(steps, abort_fails=failing == "abort")
        await engine.start_handler()
        with pytest.raises(RuntimeError, match=f"{failing} failed"):
            await abort_and_stop(cast(Any, engine), ["a"], _stop(steps, fails=failing == "stop"))
        return steps

    assert asyncio.run(run()) == ["handler cancelled", "abort ['a']", "stop", "fail streams: EngineDeadError"]


def test_streams_read_on_another_loop_fail_on_that_loop(other_loop: asyncio.AbstractEventLoop) -> None:
    steps: list[str] = []
    engine = _Engine(steps)
    asyncio.run_coroutine_threadsafe(engine.start_handler(), other_loop).result(timeout=5)

    async def run() -> None:
        await abort_and_stop(cast(Any, engine), ["a"], _stop(steps))

    asyncio.run(run())
    asyncio.run_coroutine_threadsafe(asyncio.sleep(0), other_loop).result(timeout=5)  # its queued calls ran
    # The handler is vLLM's to cancel there; the abort and the failing run on that loop.
    assert steps == ["abort ['a']", "stop", "fail streams: EngineDeadError"]
    threads = engine.output_processor.threads
    assert len(threads) == 2 and threading.get_ident() not in threads
    assert engine.output_handler is not None and not engine.output_handler.done()
    asyncio.run_coroutine_threadsafe(_cancelled(engine.output_handler), other_loop).result(timeout=5)


async def _cancelled(task: asyncio.Task[None]) -> None:
    """``task`` cancelled and ended, as vLLM's shutdown ends its handler."""
    task.cancel()
    await asyncio.wait({task})
