"""What a handle call returns: the future result of a call, the items a generator method
yields as it yields them, and the answers of a broadcast (Ray Serve's names and methods).
The handles that make them are in ``app_toolkit.handle``."""

from __future__ import annotations

import weakref
from collections.abc import Generator
from typing import Any, Generic, Protocol, cast

from typing_extensions import TypeVar

from app_toolkit._runtime.routing import broadcast
from app_toolkit._runtime.routing.data_plane import DataPlane, InFlight, Pending, in_async_code
from app_toolkit.exceptions import RequestTimeoutError

R = TypeVar("R")


class DeploymentResponse(InFlight, Generic[R]):
    """The future result of one handle call: ``await`` it or call :meth:`result`."""

    __slots__ = ("_pending",)

    def __init__(self, pending: Pending[R]) -> None:
        self._pending = pending

    def __await__(self) -> Generator[object, None, R]:
        return self._pending.__await__()

    def result(self, timeout_s: float | None = None) -> R:
        """Block until the result is ready (sync code only); raise what the method raised.

        ``timeout_s`` bounds the wait, not the call: after a ``RequestTimeoutError`` the
        call goes on and a later ``result()`` returns its value (``cancel()`` stops it).
        """
        try:
            return self._pending.result(timeout_s)
        except TimeoutError:
            raise RequestTimeoutError(f"No result within {timeout_s} s") from None

    def cancel(self) -> None:
        """Cancel the call wherever it is (queued or running)."""
        self._pending.cancel()

    def done(self) -> bool:
        return self._pending.done()


class _CallStream(Protocol):
    """One streamed call, on the data plane's loop (``_runtime/routing/streamed_calls.py``)."""

    async def next(self) -> object: ...

    def finish(self, error: str = "") -> None: ...


class DeploymentResponseGenerator(Generic[R]):
    """The items a generator method yields, as it yields them.

    Iterate with ``async for`` in async code or ``for`` in sync code. Stopping early
    (:meth:`cancel`, or the consuming task being cancelled) closes the generator on the
    replica. The stream belongs to the process's data plane: a generator dropped
    mid-stream without ``cancel()`` is handed back to it to close, and closing the data
    plane (shutdown) ends every open stream.
    """

    def __init__(self, plane: DataPlane, stream: _CallStream) -> None:
        self._plane = plane
        self._stream = stream
        # Dropped without cancel(): the data plane closes the stream on its own loop.
        finalizer = weakref.finalize(self, plane.call_soon, stream.finish)
        finalizer.atexit = False

    def __aiter__(self) -> DeploymentResponseGenerator[R]:
        return self

    async def __anext__(self) -> R:
        if self._plane.on_loop():
            return cast(R, await self._stream.next())
        return cast(R, await self._plane.submit(self._stream.next()))

    def __iter__(self) -> DeploymentResponseGenerator[R]:
        return self

    def __next__(self) -> R:
        if in_async_code():
            raise RuntimeError(
                "Sync methods should not be called from within an `asyncio` event loop. Use "
                "`async for` or `await response.__anext__()` instead."
            )
        try:
            return cast(R, self._plane.run(self._stream.next()))
        except StopAsyncIteration:
            raise StopIteration from None

    def cancel(self) -> None:
        """Stop the stream: the replica closes the generator."""
        self._plane.call_soon(self._stream.finish)


class DeploymentBroadcastResponse:
    """The answers of a :meth:`DeploymentHandle.broadcast`, one per replica it reached:
    :meth:`results` in sync code, ``await`` :meth:`results_async` in async code (Ray
    Serve's name and methods).

    The list holds one entry per replica in the caller's replica table when the broadcast
    was sent, in no promised order. A replica whose method raised (or that was lost)
    gives its exception in its place; the other replicas still run the method and answer.
    """

    __slots__ = ("_pending",)

    def __init__(self, pending: Pending[list[broadcast.Outcome]]) -> None:
        self._pending = pending

    def results(self, *, timeout_s: float | None = None, return_exceptions: bool = False) -> list[Any]:
        """Block until every replica has answered (sync code only); return their values.

        A replica's exception is raised (the first in the list's order), or with
        ``return_exceptions=True`` put in that replica's place. ``timeout_s`` bounds the
        wait (then ``RequestTimeoutError``, a ``TimeoutError``), not the calls, which go
        on; a later call of ``results()`` gets their answers (``cancel()`` stops them).
        """
        try:
            outcomes = self._pending.result(timeout_s)
        except TimeoutError:
            raise RequestTimeoutError(f"Not every replica answered within {timeout_s} s") from None
        return broadcast.results(outcomes, return_exceptions)

    async def results_async(
        self, *, timeout_s: float | None = None, return_exceptions: bool = False
    ) -> list[Any]:
        """:meth:`results`, awaited instead of blocking."""
        try:
            outcomes = await self._pending.wait(timeout_s)
        except TimeoutError:
            raise RequestTimeoutError(f"Not every replica answered within {timeout_s} s") from None
        return broadcast.results(outcomes, return_exceptions)

    def cancel(self) -> None:
        """Cancel the calls on every replica that still runs one."""
        self._pending.cancel()

    def done(self) -> bool:
        """Every replica has answered (or the broadcast failed or was cancelled)."""
        return self._pending.done()
