"""A caller's side of a continuable stream (``@continuable``): the items it received, kept
within the method's bound, and the call that continues the stream on another replica
when its own is lost (``handle.py``'s stream sends it)."""

from __future__ import annotations

import dataclasses
import logging

from app_toolkit._runtime.messages import DeploymentID, MethodCall, StreamContinuation
from app_toolkit._runtime.request_values import Share
from app_toolkit._runtime.routing import caller_metrics
from app_toolkit.exceptions import BackPressureError, ReplicaUnavailableError

logger = logging.getLogger("app_toolkit.router")

#: The class a continuation waits in: ahead of every API key's (lower goes first), in the
#: caller's queue and where the engine queues by class.
CONTINUATION_CLASS = -(2**31)


class Continuation:
    """One continuable stream's items so far and its continuations."""

    __slots__ = ("_rule", "_deployment", "_items", "_ended", "count")

    def __init__(self, rule: StreamContinuation, deployment: DeploymentID) -> None:
        self._rule = rule
        self._deployment = deployment
        self._items: list[object] | None = []  # None: past the bound, not continued
        self._ended = False  # a continuation found no replica in time: the stream ends
        self.count = 0

    @property
    def wait_s(self) -> float:
        return self._rule.wait_s

    def keep(self, item: object) -> None:
        items = self._items
        if items is None:
            return
        if len(items) >= self._rule.max_items:
            self._items = None
            logger.info(
                "A stream of %s.%s passed %d items: it is no longer continued if its replica is lost",
                self._deployment,
                self._rule.method,
                self._rule.max_items,
            )
            return
        items.append(item)

    def after(self, error: BaseException, call: MethodCall) -> MethodCall | None:
        """The call that continues the stream after ``error`` (its replica lost, or gone
        under it), or None when the stream ends with it: another error, its limit
        reached, or more items than the bound."""
        cut = isinstance(error, ReplicaUnavailableError) and not isinstance(error, BackPressureError)
        if self._ended or not cut:
            return None
        if self._items is None or self.count >= self._rule.limit:
            caller_metrics.continued(self._deployment, self._rule.method, "ended")
            logger.warning(
                "Request %s: the stream of %s.%s was cut (%s) and is not continued: %s",
                call.request_id,
                self._deployment,
                self._rule.method,
                error,
                "past its item bound" if self._items is None else f"continued {self.count} times already",
            )
            return None
        self.count += 1
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

    def taken(self, outcome: str) -> None:
        """A continuation sent: another replica took it (``continued``) or none did in
        time (``ended``: the stream ends)."""
        self._ended = outcome == "ended"
        caller_metrics.continued(self._deployment, self._rule.method, outcome)
