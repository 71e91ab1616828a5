"""@batch: grouping, flushing, isolation, cancellation, streaming, tuning, metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

import app_toolkit as tk
from app_toolkit import metrics
from app_toolkit._runtime.replica.batch_queue import BatchQueue, Pending, by_group
from app_toolkit._runtime.request_values import CURRENT, RequestValues

pytestmark = pytest.mark.anyio


# ----------------------------------------------------------------- the pure queue (fake clock)


def test_queue_flushes_when_full_or_when_the_first_item_waited_long_enough() -> None:
    queue = BatchQueue(max_batch_size=3, batch_wait_timeout_s=0.5)
    assert queue.flush_at() is None and not queue.ready(100.0)
    queue.add(Pending("a", enqueued_at=10.0))
    queue.add(Pending("b", enqueued_at=10.3))
    assert queue.flush_at() == 10.5
    assert not queue.ready(10.4)
    assert queue.ready(10.5)
    queue.add(Pending("c", enqueued_at=10.4))
    assert queue.ready(10.41)  # full
    assert [p.value for p in queue.take()] == ["a", "b", "c"]


def test_take_respects_sizes_and_lets_an_oversized_item_go_alone() -> None:
    queue = BatchQueue(max_batch_size=10, batch_wait_timeout_s=0)
    for value, size in (("a", 4), ("b", 5), ("c", 3), ("huge", 50), ("d", 1)):
        queue.add(Pending(value, 0.0, size=size))
    assert [p.value for p in queue.take()] == ["a", "b"]
    assert [p.value for p in queue.take()] == ["c"]
    assert [p.value for p in queue.take()] == ["huge"]
    assert [p.value for p in queue.take()] == ["d"]


def test_a_batch_fills_with_every_model_and_runs_as_one_call_per_model() -> None:
    """Ray Serve fills a batch up to max_batch_size whatever the models, then splits it
    by model id (each call sees one)."""
    queue = BatchQueue(max_batch_size=4, batch_wait_timeout_s=30)
    for value, model in (("a1", "a"), ("b1", "b"), ("a2", "a"), ("c1", "c"), ("b2", "b")):
        queue.add(Pending(value, 0.0, model))
    assert queue.ready(0.0)  # full: four items of three models, long before the timeout
    groups = by_group(queue.take())
    assert [[p.value for p in group] for group in groups] == [["a1", "a2"], ["b1"], ["c1"]]
    assert [p.value for p in queue.items] == ["b2"]


# ----------------------------------------------------------------- behaviour on a real loop


class Model:
    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.gate: asyncio.Event | None = None

    @tk.batch(max_batch_size=4, batch_wait_timeout_s=0.05)
    async def double(self, items: list[int]) -> list[Any]:
        self.batches.append(list(items))
        if self.gate is not None:
            await self.gate.wait()
        return [ValueError(f"bad {i}") if i < 0 else 2 * i for i in items]

    @tk.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def broken(self, items: list[int]) -> list[int]:
        if 13 in items:
            raise RuntimeError("the device fell over")
        return items[:-1]  # one result short

    @tk.batch(max_batch_size=4, batch_wait_timeout_s=0.02)
    async def count_up(self, limits: list[int]) -> AsyncIterator[list[Any]]:
        for step in range(max(limits)):
            yield [step if step < limit else StopIteration for limit in limits]


async def test_concurrent_calls_are_grouped_and_each_gets_its_own_result() -> None:
    model = Model()
    results = await asyncio.gather(*(model.double(i) for i in range(10)))
    assert results == [2 * i for i in range(10)]
    assert [len(b) for b in model.batches] == [4, 4, 2]


async def test_the_calls_of_one_batch_run_at_once_each_with_its_own_model_id() -> None:
    """One batch of two models (full long before its 30 s wait) runs as two calls at once
    within max_concurrent_batches=1: each waits for the other to start, then still reads
    its own model id (each call's context is its own)."""
    started: list[str] = []
    both = asyncio.Event()

    class Multiplexed:
        @tk.batch(max_batch_size=4, batch_wait_timeout_s=30)
        async def run(self, items: list[str]) -> list[str]:
            before = tk.get_multiplexed_model_id()
            started.append(before)
            if len(started) == 2:
                both.set()
            await both.wait()
            return [f"{before}/{tk.get_multiplexed_model_id()}/{item}" for item in items]

    model = Multiplexed()

    async def call(model_id: str, item: str) -> str:
        CURRENT.set(RequestValues("", None, model_id))  # this caller's request asks for model_id
        return await model.run(item)

    results = await asyncio.wait_for(
        asyncio.gather(call("a", "1"), call("b", "2"), call("a", "3"), call("b", "4")), 10
    )
    assert list(results) == ["a/a/1", "b/b/2", "a/a/3", "b/b/4"]
    assert sorted(started) == ["a", "b"]
    function = Multiplexed.run.__qualname__  # recorded per call, as Ray Serve records them
    assert metrics.value("app_toolkit_batches_total", function=function) == 2
    sizes = metrics.value("app_toolkit_batch_size", function=function)
    assert isinstance(sizes, metrics.HistogramValue) and sizes.count == 2 and sizes.mean == 2


async def test_a_lone_call_waits_at_most_the_timeout() -> None:
    model = Model()
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await model.double(21) == 42
    assert model.batches == [[21]]
    assert loop.time() - start < 0.05 + 1.0  # flushed by the timeout, not by more items


async def test_an_exception_in_one_slot_fails_only_that_caller() -> None:
    model = Model()
    outcomes = await asyncio.gather(
        model.double(1), model.double(-1), model.double(3), return_exceptions=True
    )
    assert outcomes[0] == 2 and outcomes[2] == 6
    assert isinstance(outcomes[1], ValueError) and str(outcomes[1]) == "bad -1"


async def test_a_failing_batch_fails_its_callers_and_the_batcher_goes_on() -> None:
    model = Model()
    outcomes = await asyncio.gather(model.broken(13), model.broken(1), return_exceptions=True)
    assert all(isinstance(o, RuntimeError) and "fell over" in str(o) for o in outcomes)
    with pytest.raises(TypeError, match="one result per input: got 1 results for a batch of 2"):
        await asyncio.gather(model.broken(1), model.broken(2))
    assert await model.double(5) == 10  # other batchers unaffected


async def test_a_cancelled_caller_leaves_a_waiting_batch_and_cancels_no_one() -> None:
    model = Model()
    model.gate = asyncio.Event()
    first = asyncio.ensure_future(model.double(1))  # runs alone and blocks on the gate
    await asyncio.sleep(0.1)
    waiting = [asyncio.ensure_future(model.double(i)) for i in (2, 3, 4)]
    await asyncio.sleep(0)
    waiting[1].cancel()  # leaves before its batch starts
    await asyncio.sleep(0.01)
    model.gate.set()
    assert await first == 2
    assert await waiting[0] == 4 and await waiting[2] == 8
    assert waiting[1].cancelled()
    assert model.batches == [[1], [2, 4]]


async def test_cancelling_a_caller_inside_a_running_batch_spares_the_others() -> None:
    model = Model()
    model.gate = asyncio.Event()
    calls = [asyncio.ensure_future(model.double(i)) for i in (1, 2, 3)]
    await asyncio.sleep(0.1)  # the batch is running, blocked on the gate
    calls[0].cancel()
    await asyncio.sleep(0)
    model.gate.set()
    assert [await calls[1], await calls[2]] == [4, 6]


async def test_streaming_batches_give_each_caller_its_own_stream() -> None:
    model = Model()

    async def collect(limit: int) -> list[int]:
        return [value async for value in model.count_up(limit)]

    streams = list(await asyncio.gather(collect(1), collect(3), collect(2)))  # typeshed says a tuple
    assert streams == [[0], [0, 1, 2], [0, 1]]


async def test_batch_limits_change_at_run_time() -> None:
    model = Model()
    model.double.set_max_batch_size(2)
    model.double.set_batch_wait_timeout_s(0.001)
    await asyncio.gather(*(model.double(i) for i in range(6)))
    assert [len(b) for b in model.batches] == [2, 2, 2]
    with pytest.raises(tk.ConfigError, match="max_batch_size"):
        model.double.set_max_batch_size(0)


async def test_batch_sizes_and_waits_are_recorded() -> None:
    async def identity_for_metrics(items: list[int]) -> list[int]:
        return items

    batched = tk.batch(max_batch_size=5, batch_wait_timeout_s=0.01)(identity_for_metrics)
    await asyncio.gather(*(batched(i) for i in range(5)))
    function = identity_for_metrics.__qualname__
    sizes = metrics.value("app_toolkit_batch_size", function=function)
    assert isinstance(sizes, metrics.HistogramValue) and sizes.count == 1 and sizes.mean == 5
    waits = metrics.value("app_toolkit_batch_wait_seconds", function=function)
    assert isinstance(waits, metrics.HistogramValue) and waits.count == 1 and 0 <= waits.mean < 1
    assert metrics.value("app_toolkit_batches_total", function=function) == 1


def test_bad_batch_declarations_fail_fast(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(tk.ConfigError, match="needs an async function"):

        @tk.batch()  # type: ignore[arg-type]  # not async, on purpose
        def sync_batch(items: list[int]) -> list[int]:
            return items

    with pytest.raises(tk.ConfigError, match="max_batch_size Input should be greater than or equal to 1"):
        tk.batch(max_batch_size=0)

    class Big:
        @tk.batch(max_batch_size=64, max_concurrent_batches=2)
        async def run(self, items: list[int]) -> list[int]:
            return items

    with caplog.at_level(logging.WARNING, logger="app_toolkit"):
        tk.deployment(max_ongoing_requests=100)(Big)
    assert "can never fill; raise max_ongoing_requests to at least 128" in caplog.text
