"""A caller's side of a continuable stream (``@continuable``): the items it received, kept
within the method's bound, the call that continues the stream on another replica when its
own is lost, and the wait for a replica to take it (``streamed_calls.py`` sends it)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable

from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.messages import DeploymentID, MethodCall, StreamContinuation
from app_toolkit._runtime.request_values import Share
from app_toolkit._runtime.routing import caller_metrics
from app_toolkit._runtime.routing.replica_client import Reply
from app_toolkit.exceptions import BackPressureError, ContinuationRefused, ReplicaUnavailableError

logger = logging.getLogger("app_toolkit.router")

#: The class a continuation waits in: ahead of every API key's (lower goes first), in the
#: caller's queue and where the engine queues by class.
CONTINUATION_CLASS = -(2**31)

#: Bytes the kept items of all continuable streams of one caller process take at most
#: (each stream's own bound is its method's ``max_bytes``): a stream whose next item
#: would pass it is no longer continued, and gives back what it kept.
PROCESS_MAX_BYTES = 1 << 30


#: A full process warns of the streams it no longer continues once in this long.
FULL_WARNING_EVERY_S = 60.0


class _Kept:
    """The bytes every continuable stream of this process keeps (on the data plane's loop)."""

    __slots__ = ("used", "warned_at")

    def __init__(self) -> None:
        self.used = 0
        self.warned_at = -FULL_WARNING_EVERY_S  # when it last warned that it was full

    def warn_full(self, deployment: DeploymentID, method: str) -> None:
        """A stream is no longer continued because the process keeps all it may: said
        once a minute at most (under memory pressure every new stream would say it)."""
        now = time.monotonic()
        if now - self.warned_at < FULL_WARNING_EVERY_S:
            return
        self.warned_at = now
        logger.warning(
            "Streams such as one of %s.%s are no longer continued if their replica is lost: "
            "this process's continuable streams keep %d bytes, the most they may (said once "
            "a minute at most)",
            deployment,
            method,
            self.used,
        )


KEPT = _Kept()


#: Sends a call, telling the first callable of each exchange it opens on a replica and
#: calling the second when a replica refuses it (it goes on to another).
Send = Callable[[Callable[[Exchange], None], Callable[[], None]], Awaitable[Reply]]


class Continuation:
    """One continuable stream's items so far and its continuations."""

    __slots__ = ("_rule", "_deployment", "_items", "_bytes", "_ended", "count", "loss")

    def __init__(self, rule: StreamContinuation, deployment: DeploymentID) -> None:
        self._rule = rule
        self._deployment = deployment
        self._items: list[object] | None = []  # None: past a bound, not continued
        self._bytes = 0  # the kept items' size as they crossed the channel (in KEPT.used)
        self._ended = False  # no replica took a continuation in time: the stream ends
        self.count = 0
        #: The error the stream was cut with last (what it ends with if not continued).
        self.loss: BaseException | None = None

    @property
    def wait_s(self) -> float:
        return self._rule.wait_s

    def keep(self, item: object, size: int) -> None:
        """Keep ``item`` (``size``: its cost as it crossed the channel), unless a bound is
        passed: then none are kept and the stream is no longer continued."""
        items = self._items
        if items is None:
            return
        rule = self._rule
        if len(items) >= rule.max_items or self._bytes + size > rule.max_bytes:
            self.release()
            logger.info(
                "A stream of %s.%s passed %d items or %d bytes: it is no longer continued if its "
                "replica is lost",
                self._deployment,
                rule.method,
                rule.max_items,
                rule.max_bytes,
            )
        elif KEPT.used + size > PROCESS_MAX_BYTES:
            self.release()
            KEPT.warn_full(self._deployment, rule.method)
        else:
            items.append(item)
            self._bytes += size
            KEPT.used += size

    def release(self) -> None:
        """Give back what the stream kept: it ended, or is no longer continued."""
        KEPT.used -= self._bytes
        self._bytes = 0
        self._items = None

    def after(self, error: BaseException, call: MethodCall) -> MethodCall | None:
        """The call that continues the stream after ``error`` (its replica lost, or gone
        under it), or None when the stream ends with it: another error, one saying the
        stream cannot be continued, its limit reached, more items than the bound, or a
        request not given as the call's first argument."""
        cut = isinstance(error, ReplicaUnavailableError) and not isinstance(error, ContinuationRefused)
        if self._ended or not cut or not call.args:
            return None
        if self._items is None or self.count >= self._rule.limit:
            self.end()
            logger.warning(
                "Request %s: the stream of %s.%s was cut (%s) and is not continued: %s",
                call.request_id,
                self._deployment,
                self._rule.method,
                error,
                "past a bound (items or bytes)" if self._items is None else f"continued {self.count} times",
            )
            return None
        self.count += 1
        self.loss = error
        logger.warning(
            "Request %s: the stream of %s.%s was cut (%s); continuing it on another replica "
            "after %d items (continuation %d of %d)",
            call.request_id,
            self._deployment,
            self._rule.method,
            error,
            len(self._items),
            self.count,
            self._rule.limit,
        )
        given = call.share or Share("")
        share = dataclasses.replace(given, priority=CONTINUATION_CLASS)
        return dataclasses.replace(call, continued=tuple(self._items) if self._items else None, share=share)

    def refused(self, error: BaseException) -> bool:
        """Whether ``error`` ends a continued stream as its loss did: a replica could not
        continue it, or the continuation could not be sent (counted as ended)."""
        if isinstance(error, ContinuationRefused | BackPressureError):
            self.end()
            return True
        return False

    def continued(self) -> None:
        """Another replica took the stream on (its first answer came)."""
        caller_metrics.continued(self._deployment, self._rule.method, "continued")

    def end(self) -> None:
        """The stream ends with its loss: a bound reached, or no replica took it in time."""
        self._ended = True
        self.release()
        caller_metrics.continued(self._deployment, self._rule.method, "ended")


class _Taking:
    """Whether a replica holds a call now: it opened it and has not refused it since."""

    def __init__(self) -> None:
        self.taken = False
        self.changed = asyncio.Event()

    def opened(self, _exchange: Exchange) -> None:
        self.taken = True
        self.changed.set()

    def refused(self) -> None:
        self.taken = False
        self.changed.set()


async def sent_within(send: Send, wait_s: float) -> Reply | None:
    """``send``'s reply, if a replica takes the call within ``wait_s`` (once one holds
    it, the reply takes as long as it takes; a refusal starts the wait again, with what
    is left of it); None, the send stopped, when none did."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    taking = _Taking()
    sending = asyncio.ensure_future(send(taking.opened, taking.refused))
    try:
        while not sending.done():
            taking.changed.clear()
            timeout = None if taking.taken else max(0.0, deadline - loop.time())
            changed = asyncio.ensure_future(taking.changed.wait())
            try:
                done, _ = await asyncio.wait(
                    {sending, changed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                changed.cancel()
            if not done:
                _drop(sending)
                return None
        return sending.result()
    except BaseException:  # cancelled (the caller left): the call stops, its slot given back
        _drop(sending)
        raise


def _drop(sending: asyncio.Future[Reply]) -> None:
    """Stop a send: cancelled if under way, its reply given back if it has one."""
    if not sending.done():
        sending.cancel()
        sending.add_done_callback(_drop)
        return
    if not sending.cancelled() and sending.exception() is None:
        reply = sending.result()
        reply.exchange.cancel()
        reply.release()
