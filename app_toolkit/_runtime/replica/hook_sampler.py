"""Calling one of a replica's statistics hooks on a period: the rules the user's
``record_autoscaling_stats()`` (``autoscaling_stats.py``) and ``record_routing_stats()``
(``routing_stats.py``) share.

One call at a time, each bounded by its timeout: past it the call is cancelled, and what
cannot be stopped (a sync method's thread, a coroutine that ignores its cancellation) is
waited for, never stacked up: no new call starts until it has ended. A call that fails,
overruns or returns what its user refuses is logged (once per distinct problem, so a
hook that fails every second does not flood the log) and skipped; it never stops the
replica (STYLE 11).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import ClassVar

from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.replica.user_code import call_maybe_async, is_async
from app_toolkit._runtime.waiting import wait_event
from app_toolkit.config import DeploymentConfig

logger = logging.getLogger("app_toolkit.replica")

#: How long ``stop()`` waits for a cancelled call to end (one may ignore its cancellation).
_STOP_WAIT_S = 1.0

#: When to call: (period, timeout) in seconds, read before each call; None: not now
#: (until ``HookSampler.wake``).
Schedule = Callable[[], tuple[float, float] | None]
#: Takes one call's result and the loop's time; returns "" once kept, else the problem.
Keep = Callable[[object, float], str]


class HookSampler:
    """Calls ``method`` (one of a replica's hooks) on ``schedule``; owns the sampling task
    and the newest call. ``skipped`` ends each problem's log line: what a skipped call
    means for its readers."""

    def __init__(
        self, method: Callable[[], object], label: str, schedule: Schedule, keep: Keep, skipped: str
    ) -> None:
        self._method = method
        # A sync method runs in a thread (call_maybe_async): the sampler sees while it does.
        self._function = method if is_async(method) else self._method_in_thread
        self._in_thread = False
        self._call: asyncio.Task[object] | None = None  # the newest call (owned: stop() ends it)
        self._label = label  # "replica id: method()"
        self._schedule = schedule
        self._keep = keep
        self._skipped = skipped
        self._woken = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._problem = ""  # the last problem logged

    def wake(self) -> None:
        """The schedule may have changed: read it now, not after the current period."""
        self._woken.set()

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

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._woken.clear()
            schedule = self._schedule()
            if schedule is None:  # paused: nobody reads the results now
                await self._woken.wait()  # until the options change (stop() cancels it)
                continue
            period_s, timeout_s = schedule
            started = loop.time()
            if not self._running():  # else the call that overran still runs: no sample now
                call = self._call = loop.create_task(call_maybe_async(self._function))
                done, _ = await asyncio.wait({call}, timeout=timeout_s)
                if done:
                    self._kept(call, loop.time())
                else:
                    self._report(f"did not return within {timeout_s:g} s")
                    # Stops an async call, or a coroutine a sync method returned; not a
                    # thread, nor a coroutine that ignores it (``_running`` waits for those).
                    call.cancel()
            await wait_event(self._woken, max(0.0, started + period_s - loop.time()))

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

    def _kept(self, call: asyncio.Task[object], now: float) -> None:
        error = call.exception()
        if error is not None:
            problem = f"raised {type(error).__name__}: {error}"
        else:
            try:
                problem = self._keep(call.result(), now)
            except Exception as exc:  # noqa: BLE001 - a result no reader could take (say, nested too deep)
                problem = f"returned what cannot be read ({type(exc).__name__}: {exc})"
        if problem:
            self._report(problem)
        else:
            self._problem = ""

    def _report(self, problem: str) -> None:
        """Log ``problem`` (what the call did), unless it is the one logged last."""
        if problem != self._problem:
            self._problem = problem
            logger.warning("%s %s; %s", self._label, problem, self._skipped)


class StatsHook:
    """One replica's statistics hook: the user's method (``METHOD``, Ray Serve's name) and
    the sampler that owns its calls. A subclass says when to call (``_schedule``, from the
    replica's newest options) and what it keeps of a result (``_keep``)."""

    #: The user's method.
    METHOD: ClassVar[str]
    #: What a skipped call means for the results' readers (the end of its log line).
    SKIPPED: ClassVar[str]

    def __init__(
        self, instance: object, replica_id: str, deployment: DeploymentID, config: DeploymentConfig
    ) -> None:
        self.replica_id = replica_id
        self.deployment = deployment
        self.config = config  # the replica's newest options (see ``update``)
        self._sampler = HookSampler(
            getattr(instance, self.METHOD),
            f"{replica_id}: {self.METHOD}()",
            self._schedule,
            self._keep,
            self.SKIPPED,
        )

    @classmethod
    def wanted(cls, instance: object) -> bool:
        """Whether a replica of ``instance`` has the hook: it defines the method."""
        return callable(getattr(instance, cls.METHOD, None))

    def update(self, config: DeploymentConfig) -> None:
        """The replica's new options, changed in place: the schedule is read again now."""
        self.config = config
        self._sampler.wake()

    def start(self) -> None:
        self._sampler.start()

    async def stop(self) -> None:
        await self._sampler.stop()

    def _schedule(self) -> tuple[float, float] | None:
        """(period, timeout) in seconds; None: no calls now."""
        raise NotImplementedError

    def _keep(self, value: object, now: float) -> str:
        """Take one call's result; "" once kept, else the problem."""
        raise NotImplementedError
