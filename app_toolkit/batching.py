"""``@batch``: callers pass one item, the function gets a list (queue #3 of the design).

A batch runs when it is full (``max_batch_size``) or when ``batch_wait_timeout_s`` has
passed since its first item, so a lone request waits at most that long. Up to
``max_concurrent_batches`` batches of one replica run at once; while all run, new items
keep collecting. Each caller gets its own result: an exception instance in its slot fails
only that caller, an exception raised by the function fails the whole batch, and the
batcher keeps going either way. A caller that is cancelled before its batch starts is
removed from it and never cancels anyone else.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import (
    Any,
    Generic,
    Protocol,
    TypeVar,
    cast,
    overload,
)

from app_toolkit import metrics
from app_toolkit._runtime import request_context
from app_toolkit._runtime.replica.batch_queue import BatchQueue, Pending
from app_toolkit._runtime.waiting import wait_event
from app_toolkit.config import BatchConfig, default_of, parse_batch_config
from app_toolkit.exceptions import DefinitionError

logger = logging.getLogger("app_toolkit.batching")

T = TypeVar("T")
R = TypeVar("R")
S = TypeVar("S")
T_contra = TypeVar("T_contra", contravariant=True)
R_co = TypeVar("R_co", covariant=True)

#: The user's batch function, bound to its instance: a list of items in, a list of
#: results out (awaited, or yielded by an async generator).
BatchFunction = Callable[[list[object]], object]
#: An item's size in a batch (``batch_size_fn``).
SizeOf = Callable[[object], int]

# ----------------------------------------------------------------------------- runner

BATCH_SIZE = metrics.Histogram(
    "app_toolkit_batch_size", "Units in each batch run", ("function",), metrics.SIZE_BUCKETS
)
BATCH_WAIT = metrics.Histogram(
    "app_toolkit_batch_wait_seconds", "How long a batch's first item waited for it to run", ("function",)
)
BATCHES = metrics.Counter("app_toolkit_batches_total", "Batches run", ("function",))


class _Batcher:
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
            BATCH_SIZE.observe(sum(p.size for p in batch), self._name)
            BATCH_WAIT.observe(self.loop.time() - batch[0].enqueued_at, self._name)
            BATCHES.inc(self._name)
            task = self.loop.create_task(self._execute(batch))
            task.add_done_callback(lambda _t: self._slots.release())

    async def _execute(self, batch: list[Pending]) -> None:
        # The batch's model (this task's own context): get_multiplexed_model_id() in the
        # batch function names it, as Ray Serve's batches of one model id do.
        request_context.model_id.set(batch[0].group)
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


# ----------------------------------------------------------------------------- public API


class BatchedCallable(Protocol[T_contra, R_co]):
    """What callers see: one item in, one result out (awaitable)."""

    def __call__(self, item: T_contra, /) -> Coroutine[Any, Any, R_co]: ...

    def set_max_batch_size(self, value: int) -> None: ...

    def set_batch_wait_timeout_s(self, value: float) -> None: ...


class BatchedStream(Protocol[T_contra, R_co]):
    """What callers see of a streaming batch: one item in, its own stream out."""

    def __call__(self, item: T_contra, /) -> AsyncIterator[R_co]: ...

    def set_max_batch_size(self, value: int) -> None: ...

    def set_batch_wait_timeout_s(self, value: float) -> None: ...


class _Bound:
    """The batched function bound to one instance (or to none, for plain functions)."""

    def __init__(self, batched: _Batched[Any, Any, Any], instance: object) -> None:
        self._batched = batched
        self._instance = instance
        self.config = batched.config
        self._state: _Batcher | None = None
        functools.update_wrapper(self, batched.function)

    def _batcher(self) -> _Batcher:
        loop = asyncio.get_running_loop()
        if self._state is None or self._state.loop is not loop:
            function = self._batched.function
            call = function if self._instance is None else functools.partial(function, self._instance)
            self._state = _Batcher(
                call, self._batched.streaming, self.config, self._batched.size_fn, self._batched.__qualname__
            )
        return self._state

    async def __call__(self, item: object) -> object:
        # A real coroutine function, so callers (and replicas) can tell it is async.
        return await self._batcher().call(item)

    def set_max_batch_size(self, value: int) -> None:
        """Change the batch size limit of this replica at run time."""
        self._update("max_batch_size", value)

    def set_batch_wait_timeout_s(self, value: float) -> None:
        """Change the batch wait timeout of this replica at run time."""
        self._update("batch_wait_timeout_s", value)

    def _update(self, option: str, value: float) -> None:
        self.config = parse_batch_config(
            {**self.config.model_dump(), option: value}, f"@batch options of {self._batched.__qualname__}"
        )
        if self._state is not None:
            setattr(self._state.queue, option, getattr(self.config, option))
            self._state._wake.set()


class _BoundStream(_Bound):
    """A batched async generator bound to one instance: each call is its own stream."""

    def __call__(self, item: object) -> AsyncIterator[object]:  # type: ignore[override] # a stream per call
        return self._stream(item)

    async def _stream(self, item: object) -> AsyncIterator[object]:
        async for value in self._batcher().stream(item):
            yield value


class _Batched(Generic[S, T, R]):
    """The decorated function: a descriptor giving each instance its own batcher."""

    def __init__(self, function: Callable[..., object], config: BatchConfig, size_fn: SizeOf | None) -> None:
        self.function = function
        self.config = config
        self.size_fn = size_fn
        self.streaming = inspect.isasyncgenfunction(function)
        if not (self.streaming or inspect.iscoroutinefunction(function)):
            raise DefinitionError(
                f"@batch needs an async function (async def ...), got {function.__qualname__}; "
                "a batch runs while other requests keep arriving on the event loop"
            )
        parameters = list(inspect.signature(function).parameters)
        self.is_method = bool(parameters) and parameters[0] == "self"
        self.__qualname__ = function.__qualname__
        self._attribute = f"__app_toolkit_batch_{function.__name__}"
        self._unbound: _Bound | None = None
        functools.update_wrapper(self, function)

    def __getstate__(self) -> dict[str, object]:
        # The batcher of a plain function belongs to this process's event loop; a copy sent
        # to a replica starts its own.
        return {**self.__dict__, "_unbound": None}

    @overload
    def __get__(self, instance: None, owner: type | None) -> _Batched[S, T, R]: ...

    @overload
    def __get__(self, instance: S, owner: type | None) -> BatchedCallable[T, R]: ...

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        bound = instance.__dict__.get(self._attribute)
        if bound is None:
            bound = (_BoundStream if self.streaming else _Bound)(self, instance)
            instance.__dict__[self._attribute] = bound
        return bound

    def _function(self) -> _Bound:
        if self.is_method:
            raise TypeError(f"{self.__qualname__} is a batched method; call it on an instance")
        if self._unbound is None:
            self._unbound = (_BoundStream if self.streaming else _Bound)(self, None)
        return self._unbound

    async def __call__(self, item: object) -> object:
        # A coroutine function, so a replica serving a batched function deployment awaits it
        # on its event loop (a plain __call__ returning a coroutine would run in a thread).
        return await self._function()(item)

    def set_max_batch_size(self, value: int) -> None:
        """Change the batch size limit of a batched function at run time."""
        self._function().set_max_batch_size(value)

    def set_batch_wait_timeout_s(self, value: float) -> None:
        """Change the batch wait timeout of a batched function at run time."""
        self._function().set_batch_wait_timeout_s(value)


class _BatchedStreamMethod(_Batched[S, T, R]):
    """Typing view of a batched async-generator method."""

    @overload  # type: ignore[override]
    def __get__(self, instance: None, owner: type | None) -> _BatchedStreamMethod[S, T, R]: ...

    @overload
    def __get__(self, instance: S, owner: type | None) -> BatchedStream[T, R]: ...

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return super().__get__(instance, owner)

    def __call__(self, item: object) -> Any:
        return self._function()(item)  # each call is its own async iterator


class _Decorator:
    def __init__(self, config: BatchConfig, size_fn: SizeOf | None) -> None:
        self._config = config
        self._size_fn = size_fn

    @overload
    def __call__(self, function: Callable[[list[T]], AsyncIterator[list[R]]], /) -> BatchedStream[T, R]: ...

    @overload
    def __call__(self, function: Callable[[list[T]], Awaitable[list[R]]], /) -> BatchedCallable[T, R]: ...

    @overload
    def __call__(
        self, function: Callable[[S, list[T]], AsyncIterator[list[R]]], /
    ) -> _BatchedStreamMethod[S, T, R]: ...

    @overload
    def __call__(self, function: Callable[[S, list[T]], Awaitable[list[R]]], /) -> _Batched[S, T, R]: ...

    def __call__(self, function: Callable[..., object], /) -> Any:
        if inspect.isasyncgenfunction(function):
            return _BatchedStreamMethod(function, self._config, self._size_fn)
        return _Batched(function, self._config, self._size_fn)


@overload
def batch(_func: Callable[[list[T]], AsyncIterator[list[R]]], /) -> BatchedStream[T, R]: ...


@overload
def batch(_func: Callable[[list[T]], Awaitable[list[R]]], /) -> BatchedCallable[T, R]: ...


@overload
def batch(_func: Callable[[S, list[T]], AsyncIterator[list[R]]], /) -> _BatchedStreamMethod[S, T, R]: ...


@overload
def batch(_func: Callable[[S, list[T]], Awaitable[list[R]]], /) -> _Batched[S, T, R]: ...


@overload
def batch(
    _func: None = None,
    /,
    *,
    max_batch_size: int = ...,
    batch_wait_timeout_s: float = ...,
    max_concurrent_batches: int = ...,
    batch_size_fn: Callable[[Any], int] | None = None,
) -> _Decorator: ...


def batch(
    _func: Callable[..., object] | None = None,
    /,
    *,
    max_batch_size: int = default_of(BatchConfig, "max_batch_size"),
    batch_wait_timeout_s: float = default_of(BatchConfig, "batch_wait_timeout_s"),
    max_concurrent_batches: int = default_of(BatchConfig, "max_concurrent_batches"),
    batch_size_fn: Callable[[Any], int] | None = None,
) -> Any:
    """Group concurrent calls of an async method or function into batches.

    The function takes a list of items and returns (or, as an async generator, yields)
    a list with one result per item; callers pass one item and get one result::

        @tk.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
        async def embed(self, texts: list[str]) -> list[list[float]]: ...

        vector = await self.embed("hello")      # mypy: list[float]

    ``batch_size_fn(item)`` gives an item's size when items differ (e.g. tokens); a batch
    then holds up to ``max_batch_size`` units. Change limits at run time with
    ``self.embed.set_max_batch_size(n)`` / ``set_batch_wait_timeout_s(t)``. Bare
    ``@batch`` (no parentheses) takes the defaults, as in Ray Serve.
    """
    config = parse_batch_config(
        {
            "max_batch_size": max_batch_size,
            "batch_wait_timeout_s": batch_wait_timeout_s,
            "max_concurrent_batches": max_concurrent_batches,
        },
        "@batch options",
    )
    if batch_size_fn is not None and not callable(batch_size_fn):
        raise DefinitionError("batch_size_fn must be a function of one item returning its size")
    decorator = _Decorator(config, batch_size_fn)
    if _func is None:
        return decorator
    if not callable(_func):
        raise DefinitionError(f"@batch decorates functions or methods, got {type(_func).__name__}")
    return decorator(cast(Callable[..., Any], _func))


def batched_methods(cls: type) -> dict[str, BatchConfig]:
    """The ``@batch`` methods of a class and their options (for start-up checks)."""
    return {name: value.config for name, value in vars(cls).items() if isinstance(value, _Batched)}
