"""A process's connection to a running toolkit: control calls and per-loop data plane.

Handles and the public API functions go through the current ``Session``: the local one
when ``backend="local"`` is active in this process, otherwise the Ray one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
from typing import Any, Coroutine, TypeVar

from app_toolkit._runtime.dispatcher import ReplicaClient
from app_toolkit._runtime.messages import AppSpec, DeploymentID, ReplicaInfo
from app_toolkit._runtime.subscriber import TableSubscriber
from app_toolkit.status import ServeStatus

T = TypeVar("T")


class BackgroundLoop:
    """An event loop in a daemon thread, for callers that have no loop of their own."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        if self.in_loop_thread():
            coroutine.close()
            raise RuntimeError("This blocking call cannot run inside the toolkit's own event loop")
        return self.submit(coroutine).result(timeout_s)

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def stop(self) -> None:
        """Cancel what still runs on the loop, wait for it, then end the thread."""

        async def cancel_all() -> None:
            current = asyncio.current_task()
            tasks = [task for task in asyncio.all_tasks() if task is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self.loop.is_running() and not self.in_loop_thread():
            try:
                self.submit(cancel_all()).result(timeout=10)
            except Exception:  # noqa: BLE001 - best effort while stopping
                pass
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)


class Session:
    """Shared logic of the Ray and local sessions."""

    backend_name = ""

    def __init__(self) -> None:
        self._subscribers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, TableSubscriber] = (
            weakref.WeakKeyDictionary()
        )
        self._background: BackgroundLoop | None = None
        self._lock = threading.Lock()

    # --- data plane ------------------------------------------------------------

    def home_loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop every handle call must run on, or None for "the caller's own loop"."""
        return None

    def background(self) -> BackgroundLoop:
        with self._lock:
            if self._background is None:
                self._background = BackgroundLoop("app-toolkit-handles")
            return self._background

    def subscriber(self) -> TableSubscriber:
        """The tables of the running loop (call from inside that loop)."""
        loop = asyncio.get_running_loop()
        subscriber = self._subscribers.get(loop)
        if subscriber is None:
            subscriber = self._subscribers[loop] = TableSubscriber(
                self.listen, self.replica_client, self.report_load
            )
        return subscriber

    def replica_client(self, info: ReplicaInfo) -> ReplicaClient:
        raise NotImplementedError

    async def listen(self, known: dict[str, int], timeout_s: float) -> dict[str, tuple[int, Any]]:
        raise NotImplementedError

    async def report_load(self, caller: str, loads: dict[DeploymentID, float]) -> None:
        """Tell the controller one caller's load per deployment (for autoscaling)."""
        raise NotImplementedError

    # --- control plane (blocking) ----------------------------------------------

    def serialize(self, value: Any) -> bytes:
        raise NotImplementedError

    def deploy(self, spec: AppSpec) -> None:
        raise NotImplementedError

    def delete(self, name: str) -> None:
        raise NotImplementedError

    def status(self) -> ServeStatus:
        raise NotImplementedError

    def app_gone(self, name: str) -> bool:
        """True once ``name`` is deleted and all its replicas have stopped."""
        raise NotImplementedError

    def deployment_exists(self, deployment: DeploymentID) -> bool:
        status = self.status()
        app = status.applications.get(deployment.app)
        return app is not None and deployment.name in app.deployments

    def shutdown(self) -> None:
        raise NotImplementedError

    def close_subscribers(self) -> None:
        for loop, subscriber in list(self._subscribers.items()):
            if loop.is_closed():
                continue
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                subscriber.close()
            elif loop.is_running():
                loop.call_soon_threadsafe(subscriber.close)
        self._subscribers = weakref.WeakKeyDictionary()
        if self._background is not None:
            self._background.stop()
            self._background = None


_current: Session | None = None
_current_lock = threading.Lock()


def current_session(create: bool = True) -> Session | None:
    """The session of this process; connects to (or starts) Ray if there is none."""
    global _current
    with _current_lock:
        if _current is None and create:
            from app_toolkit._runtime.ray_backend import RaySession

            _current = RaySession.for_process()
        return _current


def set_current_session(session: Session | None) -> None:
    global _current
    with _current_lock:
        _current = session
