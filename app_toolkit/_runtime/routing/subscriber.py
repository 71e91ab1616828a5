"""Keeps a caller's route and replica tables current by long-polling the controller.

One long poll per caller, for every key it watches: the controller answers as soon as
any of them is newer. A key watched while a poll is out restarts the poll with it. When
the controller is unreachable the loop retries and the caller keeps serving on its last
tables (the data plane survives the control plane). A caller that starts while the
controller is down can be seeded with the tables stored last; the first answer from the
controller replaces them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.quotas import TakeQuota
from app_toolkit._runtime.routing.dispatcher import Dispatcher
from app_toolkit._runtime.routing.replica_client import Connect
from app_toolkit._runtime.tables import (
    DeploymentGone,
    Listen,
    Loads,
    Outcomes,
    ReplicaTable,
    ReportLoad,
    Table,
    replicas_key,
)
from app_toolkit._runtime.waiting import wait_event
from app_toolkit.exceptions import RequestLostError

logger = logging.getLogger("app_toolkit.subscriber")

#: Called with each new table of a key (None: the key was never published).
Apply = Callable[[Table | None], None]

LONG_POLL_TIMEOUT_S = 30.0
#: How long past its own timeout a long poll may take before the controller counts as
#: unreachable (a stopped or partitioned controller never answers).
_LISTEN_GRACE_S = 10.0
#: How long a load report may take.
_REPORT_TIMEOUT_S = 5.0
_RETRY_S = 0.5
#: How often ``holds`` looks at the version it waits for.
_HOLDS_POLL_S = 0.01
#: How often a caller reports its load; a non-zero load is repeated at least this often.
LOAD_REPORT_PERIOD_S = 0.5
LOAD_REPEAT_S = 2.0


class TableSubscriber:
    """Dispatchers for the deployments one caller talks to, fed by the controller."""

    def __init__(
        self,
        listen: Listen,
        connect: Connect,
        report: ReportLoad | None = None,
        *,
        lost_error: type[RequestLostError],
        take_quota: TakeQuota | None = None,
    ) -> None:
        self._listen = listen
        #: How this caller's fronts take their API keys' limits from the controller's ledger.
        self.take_quota = take_quota
        self._connect = connect
        self._lost_error = lost_error
        self._report = report
        self._caller_id = uuid.uuid4().hex
        self._demand = asyncio.Event()
        self._dispatchers: dict[DeploymentID, Dispatcher] = {}
        #: Stored tables to serve from until the controller answers (see ``seed``).
        self._seed: dict[str, Table] = {}
        self._tasks: list[asyncio.Task[None]] = []
        #: Load this process serves without a dispatcher (an ingress replica's requests on
        #: the client connections it owns), added to what its dispatchers report.
        self._own_loads: dict[DeploymentID, Callable[[], float]] = {}
        #: Replicas of this process with statistics hooks (custom autoscaling metrics,
        #: routing stats): replica id -> what takes their samples since the last report
        #: (sent with the loads).
        self._stats: dict[str, Callable[[], Outcomes]] = {}
        # Per watched key: the version held (-1: none yet), who applies its tables, and
        # the event set once it has one.
        self._versions: dict[str, int] = {}
        self._tables: dict[str, Table | None] = {}  # the last table of each key
        self._appliers: dict[str, list[Apply]] = {}
        self._ready: dict[str, asyncio.Event] = {}
        self._new_keys = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None
        if report is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(self._report_loads()))

    def add_load(self, deployment: DeploymentID, load: Callable[[], float]) -> None:
        """Report ``load()`` for ``deployment`` with this caller's loads (read at every
        report period): requests served here that no dispatcher counts, so that the
        autoscaler sees them."""
        self._own_loads[deployment] = load

    def add_stats(self, replica_id: str, take: Callable[[], Outcomes]) -> None:
        """Send what ``take()`` returns (a replica's custom autoscaling metrics and routing
        stats) with each load report, until ``drop_stats(replica_id)``."""
        self._stats[replica_id] = take

    def drop_stats(self, replica_id: str) -> None:
        self._stats.pop(replica_id, None)

    def dispatcher(self, deployment: DeploymentID) -> Dispatcher:
        """The dispatcher of ``deployment``; starts following its table on first use."""
        dispatcher = self._dispatchers.get(deployment)
        if dispatcher is None:
            dispatcher = self._dispatchers[deployment] = Dispatcher(
                deployment, self._connect, self._demand.set, self.dispatcher, lost_error=self._lost_error
            )

            def apply(table: Table | None) -> None:
                if isinstance(table, ReplicaTable):
                    dispatcher.update(
                        table.replicas,
                        table.max_queued_requests,
                        table.affinity,
                        table.split,
                        table.shadow,
                        table.overload,
                        table.router,
                        table.continuations,
                    )
                else:
                    reason = (
                        "was deleted or failed to deploy"
                        if isinstance(table, DeploymentGone)
                        else "does not exist"
                    )
                    dispatcher.close(f"Deployment {deployment} {reason}")

            self.watch(replicas_key(deployment), apply)
        return dispatcher

    async def dispatcher_with_table(self, deployment: DeploymentID) -> Dispatcher:
        """The dispatcher of ``deployment`` once it holds a table (a caller's first use
        waits for the controller's answer)."""
        dispatcher = self.dispatcher(deployment)
        await self._ready[replicas_key(deployment)].wait()
        return dispatcher

    async def holds(self, key: str, version: int, timeout_s: float) -> bool:
        """Whether this caller holds ``key``'s table at ``version`` or later, waiting up
        to ``timeout_s`` for it (a restarted controller's versions are larger than its
        predecessor's: controller/longpoll.py)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._versions.get(key, -1) < version:
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(_HOLDS_POLL_S)
        return True

    def seed(self, tables: dict[str, Table]) -> None:
        """Serve from ``tables`` (stored by a controller earlier) until the controller
        answers: a key watched before then starts from its stored table."""
        self._seed = dict(tables)

    def watch(self, key: str, apply: Apply) -> asyncio.Event:
        """Call ``apply(table)`` for every new table of ``key``."""
        ready = self._ready.setdefault(key, asyncio.Event())
        self._appliers.setdefault(key, []).append(apply)
        seeded = self._seed.pop(key, None)
        if key in self._tables:  # watched before, and answered: start from what it holds
            seeded = self._tables[key]
        if seeded is not None or key in self._tables:
            try:
                apply(seeded)
            except Exception:
                logger.exception("Applying the stored %s table failed", key)
            else:
                ready.set()
        if key not in self._versions:
            self._versions[key] = -1
            self._new_keys.set()
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._poll())
            self._tasks.append(self._poller)
        return ready

    async def _poll(self) -> None:
        while True:
            self._new_keys.clear()
            known = dict(self._versions)
            listening = asyncio.ensure_future(
                asyncio.wait_for(
                    self._listen(known, LONG_POLL_TIMEOUT_S), LONG_POLL_TIMEOUT_S + _LISTEN_GRACE_S
                )
            )
            more = asyncio.ensure_future(self._new_keys.wait())
            try:
                await asyncio.wait({listening, more}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                listening.cancel()
                more.cancel()
                # The loop is ending (asyncio.run() returning, shutdown): drop connections
                # now rather than leave transports to a closed loop.
                self._close_dispatchers("The caller's event loop is closing")
                raise
            more.cancel()
            if not listening.done():
                listening.cancel()  # a key was added: ask again, with it
                continue
            try:
                updates = listening.result()
            except Exception as exc:  # noqa: BLE001 - keep serving on the last tables
                logger.warning("Cannot reach the controller (%r); keeping the last tables", exc)
                await asyncio.sleep(_RETRY_S)
                continue
            self._seed.clear()  # the controller answers: stored tables are out of date
            for key, update in updates.items():
                if key not in self._versions:
                    continue
                self._versions[key] = update.version
                self._tables[key] = update.table
                for apply in self._appliers.get(key, ()):
                    try:
                        apply(update.table)
                    except Exception:
                        logger.exception("Applying a new %s table failed", key)
                self._ready[key].set()

    async def _report_loads(self) -> None:
        """Tell the controller this caller's load: on change, while non-zero every few
        seconds, and at once when a request waits for a deployment with no replica."""
        assert self._report is not None
        sent: Loads = {}
        sent_at = 0.0
        loop = asyncio.get_running_loop()
        while True:
            await wait_event(self._demand, LOAD_REPORT_PERIOD_S)
            self._demand.clear()
            loads = {d: float(dispatcher.load) for d, dispatcher in self._dispatchers.items()}
            for deployment, own in self._own_loads.items():
                loads[deployment] = loads.get(deployment, 0.0) + own()
            loads = {d: load for d, load in loads.items() if load or sent.get(d)}
            outcomes: Outcomes = tuple(
                o for dispatcher in self._dispatchers.values() for o in dispatcher.take_outcomes()
            )
            outcomes += tuple(sample for take in self._stats.values() for sample in take())
            repeat = any(loads.values()) and loop.time() - sent_at >= LOAD_REPEAT_S
            if loads == sent and not repeat and not outcomes:
                continue
            try:
                await asyncio.wait_for(self._report(self._caller_id, loads, outcomes), _REPORT_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a report is retried, never fatal
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
