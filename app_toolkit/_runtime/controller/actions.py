"""Performing what the pure transitions decide: each action a deployment's plan returns
becomes a backend call (started as a task, its outcome fed back as an event), a table
published, or a line in the lifecycle log."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from app_toolkit._runtime.controller import controller_metrics, replica_calls
from app_toolkit._runtime.controller.backend import Backend, Seat
from app_toolkit._runtime.controller.deployment_state import Action, PublishGone, StartReplica
from app_toolkit._runtime.controller.heap import HeapKeeper
from app_toolkit._runtime.controller.longpoll import LongPollHost
from app_toolkit._runtime.controller.publishing import TablePublisher
from app_toolkit._runtime.controller.replica_state import (
    CancelStart,
    CheckHealth,
    Event,
    Log,
    PublishReplicas,
    ReconfigureReplica,
    Replace,
    Stopped,
    StopReplica,
)
from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.request_context import ReplicaRank
from app_toolkit._runtime.tables import DeploymentGone, replicas_key

logger = logging.getLogger("app_toolkit.controller")

#: How long stopping waits for the backend calls under way once they are cancelled.
_STOP_TIMEOUT_S = 10.0

#: Feeds a backend call's outcome to the deployment it belongs to now.
OnEvent = Callable[[DeploymentID, str, Event], None]
#: Keeps a lifecycle line for status() (log level, message).
Record = Callable[[int, str], None]
#: A replica being started was placed on a node: its whole rank (deployment, replica id, node).
Place = Callable[[DeploymentID, str, str], ReplicaRank]


class ActionRunner:
    """Runs the controller's actions; owns the tasks of the backend calls under way."""

    def __init__(
        self,
        backend: Backend[Any],
        tables: TablePublisher,
        longpoll: LongPollHost,
        on_event: OnEvent,
        record: Record,
        place: Place,
        heap: HeapKeeper | None = None,
    ) -> None:
        self.backend = backend
        self.tables = tables
        self.longpoll = longpoll
        self._on_event = on_event
        self._record = record
        self._place = place
        self._heap = heap
        self._tasks: set[asyncio.Task[Any]] = set()
        #: The starts under way, by replica id (a stop while starting cancels its start).
        self._starts: dict[str, asyncio.Task[Event]] = {}

    def perform(self, deployment: DeploymentID, actions: list[Action]) -> None:
        backend, call = self.backend, functools.partial
        for action in actions:
            if self._heap is not None and isinstance(action, (StartReplica, StopReplica)):
                self._heap.changed()
            if isinstance(action, StartReplica):
                self._start(deployment, action)
            elif isinstance(action, CancelStart):
                self._cancel_start(action.replica_id)
            elif isinstance(action, StopReplica):
                self.spawn(self._stop(deployment, action))
            elif isinstance(action, CheckHealth):
                self._call(
                    deployment, action.replica_id, call(replica_calls.check, backend, deployment, action)
                )
            elif isinstance(action, ReconfigureReplica):
                self._call(deployment, action.replica_id, call(replica_calls.reconfigure, backend, action))
            elif isinstance(action, PublishReplicas):
                self.tables.replicas(deployment)
            elif isinstance(action, PublishGone):
                self.longpoll.publish(replicas_key(deployment), DeploymentGone())
            elif isinstance(action, Log):
                self._record(action.level, action.message)
            elif isinstance(action, Replace):
                controller_metrics.REPLACEMENTS.inc(deployment.app, deployment.name, action.reason)

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run ``coroutine`` as a task this runner cancels when it stops."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self, *others: asyncio.Task[None]) -> None:
        """Cancel every call under way (and ``others``), and wait (bounded) for them."""
        self._starts.clear()  # their cancellation is the runner's, not a replica's stop
        tasks = [*self._tasks, *others]
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=_STOP_TIMEOUT_S)
            if pending:
                logger.warning(
                    "%d controller task(s) did not stop within %s s", len(pending), _STOP_TIMEOUT_S
                )

    def _start(self, deployment: DeploymentID, action: StartReplica) -> None:
        """Start a replica; its outcome is fed back, or ``Stopped`` if the start was
        cancelled (the replica was stopped while it started)."""
        replica_id = action.replica_id
        seat = Seat(action.rank, action.world_size, functools.partial(self._place, deployment, replica_id))

        async def start() -> Event:
            return await replica_calls.start(self.backend, deployment, action, seat)

        def ended(task: asyncio.Task[Event]) -> None:
            self._tasks.discard(task)
            if self._starts.pop(replica_id, None) is None:
                return  # the runner stopped: nobody is told
            # Cancelled (even before it began): the replica was stopped while it started.
            self._on_event(deployment, replica_id, Stopped() if task.cancelled() else task.result())

        task = asyncio.get_running_loop().create_task(start())
        self._tasks.add(task)
        task.add_done_callback(ended)
        self._starts[replica_id] = task

    def _cancel_start(self, replica_id: str) -> None:
        task = self._starts.get(replica_id)
        if task is not None:
            task.cancel()

    def _call(
        self, deployment: DeploymentID, replica_id: str, outcome: Callable[[], Awaitable[Event]]
    ) -> None:
        """Run a backend call (``replica_calls``; made when the task runs, so a task
        cancelled before it starts leaves no coroutine behind) and feed its event to the
        deployment."""

        async def call() -> None:
            self._on_event(deployment, replica_id, await outcome())

        self.spawn(call())

    async def _stop(self, deployment: DeploymentID, action: StopReplica) -> None:
        try:
            await replica_calls.stop(self.backend, action)
        finally:
            self._on_event(deployment, action.replica_id, Stopped())
