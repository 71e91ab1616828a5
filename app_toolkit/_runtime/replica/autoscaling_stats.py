"""A replica's custom autoscaling metrics: the user's ``record_autoscaling_stats()``.

Ray Serve's hook: a deployment class may define ``record_autoscaling_stats(self)``, sync
or async, returning ``dict[str, float]``. The replica calls it every
``metrics_interval_s`` (of its autoscaling config), one call at a time, each bounded by
``STATS_TIMEOUT_S``: past it the call is cancelled, and what cannot be stopped (a sync
method's thread, a coroutine that ignores its cancellation) is waited for, never stacked
up: no new call starts until it has ended. The samples wait here until the process's
next load report takes them to the controller (``TableSubscriber.add_stats``: the same
report, no channel of its own). A call that fails, overruns or returns something else is
logged (once per distinct problem) and skipped; it never stops the replica.
"""

from __future__ import annotations

import asyncio
import logging
import math
import numbers
from collections import deque

from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.replica.user_code import call_maybe_async, is_async
from app_toolkit._runtime.tables import ReplicaStats
from app_toolkit.config import DeploymentConfig

logger = logging.getLogger("app_toolkit.replica")

#: The user's method (Ray Serve's name).
METHOD = "record_autoscaling_stats"
#: How long one call may take (Ray Serve's RAY_SERVE_RECORD_AUTOSCALING_STATS_TIMEOUT_S).
STATS_TIMEOUT_S = 10.0
#: How long ``stop()`` waits for a cancelled call to end (one may ignore its cancellation).
_STOP_WAIT_S = 1.0
#: Samples kept for the next report at most (a report that is slow to come: a caller's
#: report loop paced by its load, or held up by a slow controller).
_KEPT = 100


class AutoscalingStats:
    """Samples one replica's ``record_autoscaling_stats()``; owns the sampling task."""

    def __init__(
        self, instance: object, replica_id: str, deployment: DeploymentID, config: DeploymentConfig
    ) -> None:
        self._method = getattr(instance, METHOD)
        # A sync method runs in a thread (call_maybe_async): the sampler sees while it does.
        self._function = self._method if is_async(self._method) else self._method_in_thread
        self._in_thread = False
        self._call: asyncio.Task[object] | None = None  # the newest call (owned: stop() ends it)
        self.replica_id = replica_id
        self.deployment = deployment
        self.config = config  # the replica's newest options (see ``update``)
        self._updated = asyncio.Event()
        self._samples: deque[tuple[float, tuple[tuple[str, float], ...]]] = deque(maxlen=_KEPT)
        self._task: asyncio.Task[None] | None = None
        self._problem = ""  # the last problem logged

    @staticmethod
    def wanted(instance: object) -> bool:
        """Whether a replica of ``instance`` may report custom metrics: it defines the
        method (it is called while its deployment autoscales)."""
        return callable(getattr(instance, METHOD, None))

    def update(self, config: DeploymentConfig) -> None:
        """The replica's new options, changed in place: ``metrics_interval_s`` may change,
        and autoscaling turned on starts the calls, turned off pauses them."""
        self.config = config
        self._updated.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sample())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        call, self._call = self._call, None
        if call is not None and not call.done():
            call.cancel()
            await asyncio.wait({call}, timeout=_STOP_WAIT_S)  # abandoned past that

    def take(self) -> ReplicaStats | None:
        """The samples since the last take, each with its age now (None: there are none)."""
        if not self._samples:
            return None
        now = asyncio.get_running_loop().time()
        samples = tuple((now - at, values) for at, values in self._samples)
        self._samples.clear()
        return ReplicaStats(self.replica_id, self.deployment, samples)

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.config.autoscaling_config is None:  # not autoscaled (now): nobody reads them
                self._updated.clear()
                await self._updated.wait()
                continue
            started = loop.time()
            if not self._running():  # else the call that overran still runs: no sample now
                call = self._call = loop.create_task(call_maybe_async(self._function))
                done, _ = await asyncio.wait({call}, timeout=STATS_TIMEOUT_S)
                if done:
                    self._keep(call, loop.time())
                else:
                    self._report(f"did not return within {STATS_TIMEOUT_S:g} s")
                    # Stops an async call, or a coroutine a sync method returned; not a
                    # thread, nor a coroutine that ignores it (``_running`` waits for those).
                    call.cancel()
            await asyncio.sleep(max(0.0, started + self._interval() - loop.time()))

    def _method_in_thread(self) -> object:
        """The sync method, in the thread ``call_maybe_async`` calls it in."""
        self._in_thread = True
        try:
            return self._method()
        finally:
            self._in_thread = False

    def _running(self) -> bool:
        """Whether the newest call has not ended: its task, or a sync method's thread."""
        return self._in_thread or (self._call is not None and not self._call.done())

    def _interval(self) -> float:
        autoscaling = self.config.autoscaling_config
        return autoscaling.metrics_interval_s if autoscaling is not None else 10.0

    def _keep(self, call: asyncio.Task[object], now: float) -> None:
        error = call.exception()
        if error is not None:
            self._report(f"raised {type(error).__name__}: {error}")
            return
        values = _metrics(call.result())
        if values is None:
            self._report(f"returned {call.result()!r:.60}, not a dict of metric names to numbers")
            return
        self._problem = ""
        self._samples.append((now, values))

    def _report(self, problem: str) -> None:
        if problem != self._problem:
            self._problem = problem
            logger.warning(
                "%s: %s() %s; its custom metrics skip this sample", self.replica_id, METHOD, problem
            )


def _metrics(value: object) -> tuple[tuple[str, float], ...] | None:
    if not isinstance(value, dict):
        return None
    items: list[tuple[str, float]] = []
    for name, number in value.items():
        if (
            not isinstance(name, str)
            or isinstance(number, bool)
            or not isinstance(number, numbers.Real)
            or not math.isfinite(number)
        ):
            return None
        items.append((name, float(number)))
    return tuple(items)
