"""Calling the user's code from a replica: its constructor (``async def __init__`` too),
sync functions in threads so the loop keeps serving, sync generators item by item, and
the generic 500 a Starlette app answers with."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Never, cast

from app_toolkit._runtime import answers, request_context
from app_toolkit.exceptions import BackPressureError, DeployError, ReplicaUnavailableError


async def construct(cls: type, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
    """An instance of ``cls``; an ``async def __init__`` is awaited (as Ray Serve does)."""
    initializer = getattr(cls, "__init__", None)
    if inspect.iscoroutinefunction(initializer):
        instance = cast(Callable[[type], object], cls.__new__)(cls)
        await initializer(instance, *args, **kwargs)
        return instance
    return cls(*args, **kwargs)


async def run_destructor(instance: object, timeout_s: float) -> bool:
    """Call the instance's ``__del__`` once, as Ray Serve does when a replica stops: an
    ``async def __del__`` is awaited (for up to ``timeout_s``), a plain one called here.
    Its class is then swapped for a subclass whose ``__del__`` does nothing, so the
    object's collection later does not run it a second time (or leave a coroutine that
    nobody awaits). Returns whether a ``__del__`` ran; raises what it raised."""
    cls = type(instance)
    finalizer = getattr(cls, "__del__", None)
    if finalizer is None:
        return False
    try:
        result = finalizer(instance)
        if inspect.isawaitable(result):
            async with asyncio.timeout(timeout_s):
                await result
    finally:
        try:
            instance.__class__ = _ran_once(cls)
        except TypeError:  # a class whose instances cannot change class: collected as it is
            pass
    return True


_RAN_ONCE: weakref.WeakKeyDictionary[type, type] = weakref.WeakKeyDictionary()


def _ran_once(cls: type) -> type:
    ran = _RAN_ONCE.get(cls)
    if ran is None:

        def __del__(self: object) -> None:  # the destructor already ran
            pass

        namespace = {
            "__del__": __del__,
            "__slots__": (),  # the same layout, so instances can change to it
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
        }
        ran = _RAN_ONCE[cls] = type(cls.__name__, (cls,), namespace)
    return ran


def close_generator(generator: object) -> None:
    if inspect.isgenerator(generator):
        generator.close()


async def iterate_in_thread(generator: Generator[object, Never, object]) -> AsyncIterator[object]:
    """A sync generator's items, each produced in a thread so the loop keeps serving.

    When the consumer stops (the caller went away) while a thread is inside the
    generator, the generator is closed once that thread is out of it: a generator cannot
    be closed while it runs, and its ``finally`` blocks must still run.
    """
    done = object()
    inside = threading.Lock()

    def step() -> object:
        with inside:
            return next(generator, done)

    def close() -> None:
        with inside:
            generator.close()

    try:
        while True:
            item = await asyncio.to_thread(step)
            if item is done:
                return
            yield item
    finally:
        if inside.acquire(blocking=False):
            try:
                generator.close()
            finally:
                inside.release()
        else:
            asyncio.get_running_loop().run_in_executor(None, close)


def is_async(function: object) -> bool:
    """Whether ``function`` is awaited on the event loop (a coroutine function, or an
    object whose ``__call__`` is one) rather than called in a thread."""
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__call__", None)  # noqa: B004 - an async __call__, not callability
    )


async def call_maybe_async(function: Callable[..., object], *args: object, **kwargs: object) -> object:
    """``function``'s result: awaited if it is async (``is_async``), else called in a
    thread; a coroutine it returns is awaited too."""
    if is_async(function):
        return await cast(Awaitable[object], function(*args, **kwargs))
    # Sync user code runs in a thread so it never blocks the replica's event loop.
    # [True] once its caller left: a list appended on the loop and read in the thread (a
    # flag with no lock: the thread reads it once, and a call already running is dropped
    # anyway), cheaper per call than a threading.Event.
    abandoned: list[bool] = []

    def run() -> object:
        if abandoned:  # its caller left before a thread took it: it never runs
            return None
        return function(*args, **kwargs)

    loop = asyncio.get_running_loop()
    in_thread = loop.run_in_executor(None, contextvars.copy_context().run, run)
    try:
        result = await asyncio.shield(in_thread)
    except asyncio.CancelledError:
        # A thread cannot be stopped: what a running call returns is dropped, and a
        # coroutine among that closed (never awaited, it would warn).
        abandoned.append(True)
        in_thread.add_done_callback(_close_dropped)
        raise
    if inspect.iscoroutine(result):  # a plain callable that returned a coroutine: await it here
        result = await result
    return result


def _close_dropped(in_thread: asyncio.Future[object]) -> None:
    """Ends what a cancelled caller's thread returned: a coroutine is closed; an error is
    read so that it is not logged as never retrieved (the caller has gone)."""
    if in_thread.cancelled() or in_thread.exception() is not None:
        return
    result = in_thread.result()
    if inspect.iscoroutine(result):
        result.close()


def wants_reconfigure(instance: object, user_config: object) -> bool:
    """Whether ``instance`` gets a ``reconfigure`` call for ``user_config``: when there is
    one, or (as Ray Serve calls it) when its ``reconfigure`` declares ``rank``."""
    return user_config is not None or _takes_rank(instance)


async def call_reconfigure(instance: object, user_config: object, rank: object, deployment: str) -> None:
    """The user's ``reconfigure(user_config)``, with ``rank=`` (the replica's ReplicaRank)
    when it declares a ``rank`` parameter, as Ray Serve calls it."""
    method = getattr(instance, "reconfigure", None)
    if method is None:
        raise DeployError(f"{deployment} got a user_config but defines no reconfigure(self, config) method")
    if _takes_rank(instance):
        await call_maybe_async(method, user_config, rank=rank)
    else:
        await call_maybe_async(method, user_config)


def _takes_rank(instance: object) -> bool:
    method = getattr(instance, "reconfigure", None)
    if method is None or inspect.isclass(instance):
        return False
    try:
        return "rank" in inspect.signature(method).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return False


def install_error_handler(app: object) -> None:
    """Give Starlette/FastAPI apps our generic 500 body unless they chose their own, and
    overload of a downstream call as overload (``answers.for_failure``)."""
    try:
        from starlette.applications import Starlette
        from starlette.requests import Request as StarletteRequest
        from starlette.responses import Response
    except ImportError:  # pragma: no cover - starlette is a dependency
        return
    if not isinstance(app, Starlette):
        return

    async def failed(request: StarletteRequest, exc: Exception) -> Response:
        answer = answers.for_failure(exc, request_context.current_request_id())
        return Response(answer.body, answer.status, headers=answers.header_dict(answer))

    handlers = app.exception_handlers
    if Exception not in handlers and 500 not in handlers:
        handlers[Exception] = failed
    handlers.setdefault(BackPressureError, failed)
    handlers.setdefault(ReplicaUnavailableError, failed)
