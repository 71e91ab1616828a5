"""An event loop in a daemon thread, and the one way such a loop is stopped.

Used where there is no loop to borrow: a driver script's data plane, the local
backend's loop, each custom autoscaling policy's loop on the controller. Stopping is
bounded and owned: the loop's tasks are cancelled and awaited (up to a bound; those that
do not end are logged, as they catch the cancellation), async generators and the
default executor (``asyncio.to_thread``) are shut down, and the thread is joined (up to
a bound; a thread blocked in user code cannot be stopped, and is logged).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import TypeVar

logger = logging.getLogger("app_toolkit.loop_thread")

T = TypeVar("T")
#: A coroutine as asyncio drives it: what it yields is the event loop's business, and it
#: is resumed with None.
_Coroutine = Coroutine[object, None, T]
#: How long stopping may wait for the loop's tasks, and then for its thread.
STOP_TIMEOUT_S = 10.0


class LoopThread:
    """An event loop running in a daemon thread, until :meth:`stop`."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._stopping = False
        self._timeout_s = STOP_TIMEOUT_S
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        try:
            self._thread.start()
        except BaseException:
            self.loop.close()
            raise

    @property
    def name(self) -> str:
        return self._thread.name

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            try:
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                self.loop.run_until_complete(self._shutdown_default_executor())
            finally:
                self.loop.close()

    async def _shutdown_default_executor(self) -> None:
        try:
            await asyncio.wait_for(self.loop.shutdown_default_executor(), self._timeout_s)
        except TimeoutError:
            logger.warning(
                "asyncio.to_thread calls on %s did not end within %s s", self.name, self._timeout_s
            )

    def run(self, coroutine: _Coroutine[T], timeout_s: float | None = None) -> T:
        """Run ``coroutine`` on the loop and wait for its result. On the loop's own thread
        (code the loop runs, such as a replica of the local backend) only a coroutine that
        never waits can run: it runs to its end at once (reading the controller's state);
        one that would wait raises RuntimeError (blocking there would stop the loop)."""
        if threading.current_thread() is self._thread:
            return _run_without_waiting(coroutine)
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def call(self, function: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Call ``function()`` on the loop's thread, where it sees the running loop; the
        future carries what it returns or raises (RuntimeError once the loop is closed)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def call() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(function())
                except BaseException as exc:  # noqa: BLE001 - the future carries it
                    future.set_exception(exc)

        try:
            self.loop.call_soon_threadsafe(call)
        except RuntimeError as exc:  # closed
            future.set_exception(exc)
        return future

    def stop_soon(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Begin stopping, from any thread, without waiting: on the loop, cancel its tasks,
        wait up to ``timeout_s`` for them, then stop it; the thread ends after (see
        :meth:`join`)."""
        if self._stopping:
            return
        self._stopping = True
        self._timeout_s = timeout_s
        try:
            self.loop.call_soon_threadsafe(self._start_stopping)
        except RuntimeError:
            pass  # closed already

    def join(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Wait up to ``timeout_s`` for the thread to end (after :meth:`stop_soon`);
        whether it did. One still running is logged: a call blocks its loop."""
        if threading.current_thread() is self._thread:
            return False
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.warning(
                "%s did not end within %s s of being stopped (does a call block it?)", self.name, timeout_s
            )
            return False
        return True

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Cancel what runs on the loop and wait for it (up to ``timeout_s``), then for its
        executor and thread: joined for ``2 * timeout_s`` in all."""
        self.stop_soon(timeout_s)
        self.join(2 * timeout_s)

    def done(self) -> bool:
        """Whether the thread has ended."""
        return not self._thread.is_alive()

    def _start_stopping(self) -> None:
        stopper = self.loop.create_task(self._cancel_all())
        stopper.add_done_callback(lambda _: self.loop.stop())

    async def _cancel_all(self) -> None:
        current = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=self._timeout_s)
        for task in pending:
            logger.warning(
                "Task %s on %s did not end within %s s of being cancelled (does it catch CancelledError?)",
                task.get_name(),
                self.name,
                self._timeout_s,
            )


def _run_without_waiting(coroutine: _Coroutine[T]) -> T:
    try:
        coroutine.send(None)
    except StopIteration as finished:
        result: T = finished.value
        return result
    coroutine.close()
    raise RuntimeError(
        "This call waits for the toolkit's event loop, which runs the code that made it; make "
        "it from a thread (asyncio.to_thread) or before serving starts"
    )
