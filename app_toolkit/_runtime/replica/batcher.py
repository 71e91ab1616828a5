"""Running ``@batch`` functions (the public decorator is ``app_toolkit/batching.py``): one
:class:`Batcher` per function and instance collects callers' items in a
:class:`~app_toolkit._runtime.replica.batch_queue.BatchQueue`, runs a batch when it is
full or its wait is over, and settles each caller with its own result (or item stream).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import cast

from app_toolkit import metrics
from app_toolkit._runtime import request_context
from app_toolkit._runtime.replica.batch_queue import BatchQueue, Pending, by_group
from app_toolkit._runtime.waiting import wait_event
from app_toolkit.config import BatchConfig

logger = logging.getLogger("app_toolkit.batching")

#: The user's batch function, bound to its instance: a list of items in, a list of
#: results out (awaited, or yielded by an async generator).
BatchFunction = Callable[[list[object]], object]
#: An item's size in a batch (``batch_size_fn``).
SizeOf = Callable[[object], int]

BATCH_SIZE = metrics.Histogram(
    "app_toolkit_batch_size",
    "Units in each batch run (per call of the batch function)",
    ("function",),
    metrics.SIZE_BUCKETS,
)
BATCH_WAIT = metrics.Histogram(
    "app_toolkit_batch_wait_seconds", "How long a batch's first item waited for it to run", ("function",)
)
BATCHES = metrics.Counter(
    "app_toolkit_batches_total", "Batches run (calls of the batch function)", ("function",)
)


class Batcher:
    """Runs batches of one function for one instance on one event loop."""

    def __init__(
        self,
        call: BatchFunction,
        streaming: bool,
        config: BatchConfig,
        size_fn: SizeOf | None,
        name: str,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self._call = call
        self._streaming = streaming
        self._size_fn = size_fn
        self.queue = BatchQueue(config.max_batch_size, config.batch_wait_timeout_s)
        self._slots = asyncio.Semaphore(config.max_concurrent_batches)
        self._wake = asyncio.Event()
        self._name = name
        self._runner = self.loop.create_task(self._run())

    def _enqueue(self, value: object, pending: Pending) -> Pending:
        if self._size_fn is not None:
            pending.size = int(self._size_fn(value))
            if pending.size < 1:
                raise ValueError(f"batch_size_fn must return >= 1, got {pending.size}")
        self.queue.add(pending)
        self._wake.set()
        return pending

    async def call(self, value: object) -> object:
        pending = self._enqueue(
            value, Pending(value, self.loop.time(), _group(), future=self.loop.create_future())
        )
        assert pending.future is not None
        try:
            return await pending.future
        except asyncio.CancelledError:
            self._leave(pending)
            raise

    async def stream(self, value: object) -> AsyncIterator[object]:
        pending = self._enqueue(value, Pending(value, self.loop.time(), _group(), stream=asyncio.Queue()))
        assert pending.stream is not None
        try:
            while True:
                kind, item = await pending.stream.get()
                if kind == "end":
                    return
                if isinstance(item, BaseException) and kind == "error":
                    raise item
                yield item
        finally:
            self._leave(pending)

    def _leave(self, pending: Pending) -> None:
        """The caller is gone: drop its item, or its share of a running batch."""
        pending.cancelled = True
        if not pending.started:
            self.queue.remove(pending)

    async def _run(self) -> None:
        while True:
            now = self.loop.time()
            flush_at = self.queue.flush_at()
            if flush_at is None or not self.queue.ready(now):
                timeout = None if flush_at is None else max(flush_at - now, 0.0)
                await wait_event(self._wake, timeout)
                self._wake.clear()
                continue
            await self._slots.acquire()
            batch = [p for p in self.queue.take() if not p.cancelled]
            if not batch:
                self._slots.release()
                continue
            task = self.loop.create_task(self._execute_groups(by_group(batch)))
            task.add_done_callback(lambda _t: self._slots.release())

    async def _execute_groups(self, groups: list[list[Pending]]) -> None:
        """One batch, as Ray Serve runs it: a call per multiplexed model, all at once,
        within the batch's one slot of max_concurrent_batches."""
        if len(groups) == 1:
            await self._execute(groups[0])
            return
        # A task each: each call's model lives in its own task's context.
        await asyncio.gather(*(self.loop.create_task(self._execute(group)) for group in groups))

    async def _execute(self, batch: list[Pending]) -> None:
        # The batch's model (this task's own context): get_multiplexed_model_id() in the
        # batch function names it, as Ray Serve's batches of one model id do.
        request_context.serve_batch(batch[0].group)
        # Per call of the batch function (a model's share of a multiplexed batch), as Ray
        # Serve records its batches.
        BATCH_SIZE.observe(sum(p.size for p in batch), self._name)
        BATCH_WAIT.observe(self.loop.time() - batch[0].enqueued_at, self._name)
        BATCHES.inc(self._name)
        for pending in batch:
            pending.started = True
        values = [pending.value for pending in batch]
        try:
            if self._streaming:
                await self._execute_stream(batch, values)
            else:
                results = _checked(await cast(Awaitable[object], self._call(values)), len(batch))
                for pending, result in zip(batch, results, strict=True):
                    _settle(pending, result)
        except Exception as exc:  # noqa: BLE001 - the whole batch failed: every caller gets the error
            logger.warning("A batch of %d failed: %s", len(batch), exc)
            for pending in batch:
                _fail(pending, exc)
        finally:
            for pending in batch:
                _end(pending)

    async def _execute_stream(self, batch: list[Pending], values: list[object]) -> None:
        generator = cast(AsyncGenerator[object, None], self._call(values))
        try:
            async for yielded in generator:
                results = _checked(yielded, len(batch))
                for pending, result in zip(batch, results, strict=True):
                    if pending.finished or pending.cancelled:
                        continue
                    if result is StopIteration or isinstance(result, StopIteration):
                        _end(pending)  # this caller's stream is over; the others go on
                    elif isinstance(result, BaseException):
                        _fail(pending, result)
                    else:
                        assert pending.stream is not None
                        pending.stream.put_nowait(("item", result))
                if all(p.finished or p.cancelled for p in batch):
                    break
        finally:
            await generator.aclose()


def _group() -> str:
    """The batch group of the calling request: the multiplexed model it asks for."""
    return request_context.current_model_id()


def _checked(results: object, expected: int) -> Sequence[object]:
    """``results`` if it is a list (or tuple) of one result per input; else TypeError."""
    if not isinstance(results, list | tuple) or len(results) != expected:
        got = f"{len(results)} results" if isinstance(results, list | tuple) else type(results).__name__
        raise TypeError(
            f"A @batch function must return (or yield) a list with one result per input: "
            f"got {got} for a batch of {expected}"
        )
    return results


def _settle(pending: Pending, result: object) -> None:
    if isinstance(result, BaseException):
        _fail(pending, result)
    elif pending.future is not None and not pending.future.done():
        pending.future.set_result(result)


def _fail(pending: Pending, error: BaseException) -> None:
    if pending.finished:
        return
    if pending.future is not None and not pending.future.done():
        pending.future.set_exception(error)
    if pending.stream is not None:
        pending.stream.put_nowait(("error", error))
        pending.finished = True


def _end(pending: Pending) -> None:
    if pending.stream is not None and not pending.finished:
        pending.stream.put_nowait(("end", None))
    pending.finished = True
    if pending.future is not None and not pending.future.done():
        pending.future.set_exception(RuntimeError("The batch ended without a result for this item"))
