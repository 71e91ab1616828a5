"""Keeps a caller's route and replica tables current by long-polling the controller.

One poll loop per key. When the controller is unreachable the loops retry and the caller
keeps serving on its last tables (the data plane survives the control plane).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Awaitable, Callable

from app_toolkit._runtime.dispatcher import Connect, Dispatcher
from app_toolkit._runtime.longpoll import replicas_key
from app_toolkit._runtime.messages import DeploymentID

logger = logging.getLogger("app_toolkit.subscriber")

Listen = Callable[[dict[str, int], float], Awaitable[dict[str, tuple[int, Any]]]]
ReportLoad = Callable[[str, dict[DeploymentID, float]], Awaitable[None]]

LONG_POLL_TIMEOUT_S = 30.0
_RETRY_S = 0.5
#: How often a caller reports its load; a non-zero load is repeated at least this often.
LOAD_REPORT_PERIOD_S = 0.5
LOAD_REPEAT_S = 2.0


class TableSubscriber:
    """Dispatchers for the deployments one caller talks to, fed by the controller."""

    def __init__(self, listen: Listen, connect: Connect, report: ReportLoad | None = None) -> None:
        self._listen = listen
        self._connect = connect
        self._report = report
        self._caller_id = uuid.uuid4().hex
        self._demand = asyncio.Event()
        self._dispatchers: dict[DeploymentID, Dispatcher] = {}
        self._tasks: list[asyncio.Task[None]] = []
        if report is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(self._report_loads()))

    def dispatcher(self, deployment: DeploymentID) -> Dispatcher:
        """The dispatcher of ``deployment``; starts following its table on first use."""
        dispatcher = self._dispatchers.get(deployment)
        if dispatcher is None:
            dispatcher = self._dispatchers[deployment] = Dispatcher(
                deployment, self._connect, self._demand.set
            )

            def apply(value: Any, version: int) -> None:
                if value is None:
                    reason = "was deleted or failed to deploy" if version > 0 else "does not exist"
                    dispatcher.close(f"Deployment {deployment} {reason}")
                else:
                    replicas, max_queued = value
                    dispatcher.update(replicas, max_queued)

            self.watch(replicas_key(deployment), apply)
        return dispatcher

    def watch(self, key: str, apply: Callable[[Any, int], None]) -> asyncio.Event:
        """Call ``apply(value, version)`` for every new value of ``key``."""
        ready = asyncio.Event()
        task = asyncio.get_running_loop().create_task(self._poll(key, apply, ready))
        self._tasks.append(task)
        return ready

    async def _poll(self, key: str, apply: Callable[[Any, int], None], ready: asyncio.Event) -> None:
        version = -1
        while True:
            try:
                updates = await self._listen({key: version}, LONG_POLL_TIMEOUT_S)
            except asyncio.CancelledError:
                # The loop is ending (asyncio.run() returning, shutdown): drop connections
                # now rather than leave transports to a closed loop.
                self._close_dispatchers("The caller's event loop is closing")
                raise
            except Exception as exc:
                logger.warning("Cannot reach the controller (%s); keeping the last %s table", exc, key)
                await asyncio.sleep(_RETRY_S)
                continue
            if key in updates:
                version, value = updates[key]
                try:
                    apply(value, version)
                except Exception:
                    logger.exception("Applying a new %s table failed", key)
                ready.set()

    async def _report_loads(self) -> None:
        """Tell the controller this caller's load: on change, while non-zero every few
        seconds, and at once when a request waits for a deployment with no replica."""
        assert self._report is not None
        sent: dict[DeploymentID, float] = {}
        sent_at = 0.0
        loop = asyncio.get_running_loop()
        while True:
            try:
                await asyncio.wait_for(self._demand.wait(), LOAD_REPORT_PERIOD_S)
            except TimeoutError:
                pass
            self._demand.clear()
            loads = {d: float(dispatcher.load) for d, dispatcher in self._dispatchers.items()}
            loads = {d: load for d, load in loads.items() if load or sent.get(d)}
            repeat = any(loads.values()) and loop.time() - sent_at >= LOAD_REPEAT_S
            if loads == sent and not repeat:
                continue
            try:
                await self._report(self._caller_id, loads)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.debug("Could not report load (%s); will retry", exc)
                continue
            sent, sent_at = {d: load for d, load in loads.items() if load}, loop.time()

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        self._close_dispatchers("The caller shut down")

    def _close_dispatchers(self, reason: str) -> None:
        for dispatcher in self._dispatchers.values():
            dispatcher.close(reason)
