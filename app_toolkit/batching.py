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
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import (
    Any,
    Generic,
    Protocol,
    TypeVar,
    overload,
)

from app_toolkit._runtime.replica.batcher import Batcher, SizeOf
from app_toolkit.config import BatchConfig, default_of, parse_batch_config
from app_toolkit.exceptions import DefinitionError

logger = logging.getLogger("app_toolkit.batching")

T = TypeVar("T")
R = TypeVar("R")
S = TypeVar("S")
T_contra = TypeVar("T_contra", contravariant=True)
R_co = TypeVar("R_co", covariant=True)

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


class _Source(Protocol):
    """What a bound batch reads of its :class:`_Batched`: the function and its options."""

    @property
    def function(self) -> Callable[..., object]: ...

    @property
    def config(self) -> BatchConfig: ...

    @property
    def size_fn(self) -> SizeOf | None: ...

    @property
    def streaming(self) -> bool: ...

    __qualname__: str  # not a property: one of that name would replace the class's own


class _Bound:
    """The batched function bound to one instance (or to none, for plain functions)."""

    def __init__(self, batched: _Source, instance: object) -> None:
        self._batched = batched
        self._instance = instance
        self.config = batched.config
        self._state: Batcher | None = None
        functools.update_wrapper(self, batched.function)

    def _batcher(self) -> Batcher:
        loop = asyncio.get_running_loop()
        if self._state is None or self._state.loop is not loop:
            function = self._batched.function
            call = function if self._instance is None else functools.partial(function, self._instance)
            self._state = Batcher(
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

    def __get__(self, instance: object, owner: type | None = None) -> object:
        return self._bind(instance)

    def _bind(self, instance: object) -> object:
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

    def __get__(self, instance: object, owner: type | None = None) -> object:
        return self._bind(instance)

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

    def __call__(self, function: Callable[..., object], /) -> object:
        return self._wrap(function)

    def _wrap(self, function: Callable[..., object]) -> object:
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
    batch_size_fn: SizeOf | None = None,
) -> object:
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
    return decorator._wrap(_func)


def batched_methods(cls: type) -> dict[str, BatchConfig]:
    """The ``@batch`` methods of a class and their options (for start-up checks)."""
    return {name: value.config for name, value in vars(cls).items() if isinstance(value, _Batched)}
