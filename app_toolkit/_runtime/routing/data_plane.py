"""Where a process's caller side of the data plane runs: one event loop, one owner.

Every process that sends requests (a proxy, a replica calling handles, a driver script)
has one :class:`DataPlane`. It owns the event loop that the process's dispatchers, table
subscriptions and replica connections live on, and every task it starts there: closing
it cancels and awaits them, so nothing is fire-and-forget. Code on other threads or
event loops hops onto that loop; code already on it pays nothing.

The loop is borrowed (a Ray actor's own loop, the local backend's loop) or owned (a
daemon thread, for driver scripts and threads of their own).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Awaitable, Callable, Generator
from typing import Generic, Protocol, TypeVar

from app_toolkit._runtime.loop_thread import STOP_TIMEOUT_S, LoopThread, _Coroutine
from app_toolkit._runtime.messages import DeploymentID, ReplicaInfo
from app_toolkit._runtime.quotas import Charges, QuotaAsk, QuotaGrant
from app_toolkit._runtime.routing.dispatcher import Dispatcher
from app_toolkit._runtime.routing.replica_client import ReplicaClient
from app_toolkit._runtime.routing.subscriber import TableSubscriber
from app_toolkit._runtime.tables import Loads, Outcomes, Updates, Versions
from app_toolkit.exceptions import AppToolkitError, ReplicaUnavailableError, RequestLostError

logger = logging.getLogger("app_toolkit.data_plane")

T = TypeVar("T")


class CallerLink(Protocol):
    """What the data plane needs from its backend: replica connections and the
    controller's tables."""

    def connect(self, info: ReplicaInfo) -> ReplicaClient: ...

    @property
    def lost_error(self) -> type[RequestLostError]:
        """What a request lost with its replica raises (the backend's kind)."""
        ...

    async def listen(self, known: Versions, timeout_s: float) -> Updates: ...

    async def report_load(self, caller: str, loads: Loads, outcomes: Outcomes = ()) -> None: ...

    async def take_quota(
        self, front: str, asks: tuple[QuotaAsk, ...], charges: Charges = ()
    ) -> tuple[QuotaGrant, ...]: ...


class InFlight:
    """A handle call's future (``DeploymentResponse``): passed as a top-level argument of
    another call it is awaited first; inside another value it cannot travel, as in Ray
    Serve. Pickling refuses it (Ray); :func:`refuse_nested` refuses it where arguments
    pass as objects (the local backend)."""

    __slots__ = ()

    def __reduce__(self) -> tuple[object, ...]:
        raise AppToolkitError(
            "`DeploymentResponse` is not serializable. If you are passing the `DeploymentResponse` "
            "in a nested object (e.g. a list or dictionary) to a downstream deployment handle call, "
            "that is not supported: pass it as a top-level argument (it is awaited for you), or "
            "await it first"
        )


def refuse_nested(values: list[object], budget: int = 100_000) -> None:
    """Raise :class:`InFlight`'s refusal if a list, tuple, set or dict among ``values``
    holds one; each container is walked once, up to ``budget`` items."""
    seen: set[int] = set()
    while values and budget > 0:
        value = values.pop()
        budget -= 1
        if isinstance(value, InFlight):
            value.__reduce__()
        if isinstance(value, dict | list | tuple | set | frozenset) and id(value) not in seen:
            seen.add(id(value))
            values.extend(value.values() if isinstance(value, dict) else value)


class Pending(Generic[T]):
    """The result of work submitted to a :class:`DataPlane`, for any thread or loop:
    ``await`` it, or block on :meth:`result` outside async code."""

    __slots__ = ("_future",)

    def __init__(self, future: asyncio.Future[T] | concurrent.futures.Future[T]) -> None:
        self._future = future

    def __await__(self) -> Generator[object, None, T]:
        return self._here().__await__()

    async def wait(self, timeout_s: float | None = None) -> T:
        """Await the result for up to ``timeout_s`` (then ``TimeoutError``); the work
        goes on either way (``cancel()`` stops it)."""
        if timeout_s is None:
            return await self._here()
        return await asyncio.wait_for(asyncio.shield(self._here()), timeout_s)

    def _here(self) -> asyncio.Future[T]:
        """The result as a future of the running loop."""
        future = self._future
        if isinstance(future, concurrent.futures.Future):
            return asyncio.wrap_future(future)
        if future.get_loop() is asyncio.get_running_loop():
            return future  # the caller is on the data plane's loop: no hop
        return asyncio.wrap_future(_threadsafe(future))

    def result(self, timeout_s: float | None = None) -> T:
        """Block until done (raises ``TimeoutError`` after ``timeout_s``)."""
        if in_async_code():
            raise RuntimeError(
                "Sync methods should not be called from within an `asyncio` event loop. Use "
                "`await response` instead (result() would block the loop)."
            )
        future = self._future
        if not isinstance(future, concurrent.futures.Future):
            future = _threadsafe(future)
        return future.result(timeout_s)

    def cancel(self) -> None:
        """Cancel the work wherever it is (from any thread)."""
        future = self._future
        if isinstance(future, concurrent.futures.Future):
            future.cancel()  # run_coroutine_threadsafe passes this on to the task
        elif in_async_code() and asyncio.get_running_loop() is future.get_loop():
            future.cancel()
        else:
            _call_soon(future.get_loop(), lambda: _cancel(future))

    def done(self) -> bool:
        return self._future.done()


class DataPlane:
    """The owner of a process's caller-side loop and of every task it runs there."""

    def __init__(
        self,
        link: CallerLink,
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        thread_name: str = "app-toolkit-handles",
    ) -> None:
        self._link = link
        self._thread: LoopThread | None = None
        if loop is None:
            self._thread = LoopThread(thread_name)
            loop = self._thread.loop
        self.loop = loop
        self._subscriber: TableSubscriber | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self._closers: set[Callable[[], None]] = set()
        self._closed = False

    # ------------------------------------------------------------------ on the loop

    def on_loop(self) -> bool:
        """Whether the caller runs on the data plane's loop."""
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    @property
    def subscriber(self) -> TableSubscriber:
        """The process's tables and dispatchers (use on the data plane's loop only)."""
        if self._subscriber is None:
            self._subscriber = TableSubscriber(
                self._link.listen,
                self._link.connect,
                self._link.report_load,
                lost_error=self._link.lost_error,
                take_quota=self._link.take_quota,
            )
        return self._subscriber

    def dispatcher(self, deployment: DeploymentID) -> Dispatcher:
        return self.subscriber.dispatcher(deployment)

    def hold(self, close: Callable[[], None]) -> None:
        """Own a resource until it is released; closing the data plane calls ``close``."""
        self._closers.add(close)

    def release(self, close: Callable[[], None]) -> None:
        self._closers.discard(close)

    # ------------------------------------------------------------------ from anywhere

    def submit(self, coroutine: _Coroutine[T]) -> Pending[T]:
        """Run ``coroutine`` on the data plane's loop as an owned task."""
        self._check_open(coroutine)
        if self.on_loop():
            return Pending(self._own(self.loop.create_task(coroutine)))
        return Pending(asyncio.run_coroutine_threadsafe(self._owned(coroutine), self.loop))

    def run(self, coroutine: _Coroutine[T], timeout_s: float | None = None) -> T:
        """Run ``coroutine`` on the data plane's loop and block for its result."""
        if self.on_loop() or in_async_code():
            coroutine.close()
            raise RuntimeError("This call blocks, so it cannot be used inside async code")
        self._check_open(coroutine)
        return asyncio.run_coroutine_threadsafe(self._owned(coroutine), self.loop).result(timeout_s)

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the data plane's loop soon (from any thread; dropped once
        the loop is closed)."""
        _call_soon(self.loop, callback)

    def close(self) -> None:
        """Cancel and await every task, close connections, stop an owned loop thread."""
        if self._closed:
            return
        self._closed = True
        if self.on_loop():
            self._close_now()
            return
        if self.loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._drain(), self.loop).result(STOP_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - a stuck task must not stop shutdown
                logger.warning("Caller-side tasks did not finish within %s s", STOP_TIMEOUT_S)
        if self._thread is not None:
            self._thread.stop()

    # ------------------------------------------------------------------ internals

    def _check_open(self, coroutine: _Coroutine[object]) -> None:
        """Refuse work once closed: a stopped loop would never run it (the caller would
        wait forever)."""
        if self._closed or self.loop.is_closed():
            coroutine.close()
            raise ReplicaUnavailableError("The toolkit was shut down in this process; start it again")

    def _own(self, task: asyncio.Task[T]) -> asyncio.Task[T]:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _owned(self, coroutine: Awaitable[T]) -> T:
        task = asyncio.current_task()
        assert task is not None
        self._own(task)
        return await coroutine

    def _close_now(self) -> list[asyncio.Task[object]]:
        for close in list(self._closers):
            close()
        self._closers.clear()
        if self._subscriber is not None:
            self._subscriber.close()
        tasks = [task for task in self._tasks if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        return tasks

    async def _drain(self) -> None:
        tasks = self._close_now()
        await asyncio.gather(*tasks, return_exceptions=True)


def in_async_code() -> bool:
    """Whether an event loop runs in this thread (blocking here would stall it)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _threadsafe(future: asyncio.Future[T]) -> concurrent.futures.Future[T]:
    """A thread-safe view of an asyncio future of another loop."""

    async def wait() -> T:
        return await asyncio.shield(future)

    return asyncio.run_coroutine_threadsafe(wait(), future.get_loop())


def _cancel(future: asyncio.Future[T]) -> None:
    future.cancel()


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    if loop.is_closed():
        return
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:  # closed in between
        pass
