"""Callers' load reports, summed per deployment as they arrive.

Every caller (proxy, handle owner) reports its load per deployment: requests queued plus
running. The autoscaler wants each deployment's total on every reconcile pass; summing
over every caller there would cost callers x deployments per pass. The book keeps the
totals current instead: a report replaces that caller's previous one in the sums, and a
caller silent for ``ttl_s`` stops counting. No clock of its own: ``now`` comes in.
"""

from __future__ import annotations

from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.tables import Loads


class LoadBook:
    """The newest report of each caller, and their sums per deployment."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        # caller -> (time of its report, its loads); ordered oldest report first.
        self._reports: dict[str, tuple[float, Loads]] = {}
        self._totals: dict[DeploymentID, float] = {}
        # How many callers' reports name each deployment: at 0 the total is dropped
        # rather than left at a float residue that would read as demand.
        self._reporters: dict[DeploymentID, int] = {}
        self._keys: dict[DeploymentID, DeploymentID] = {}  # one object per deployment reported

    def record(self, caller: str, loads: Loads, now: float) -> None:
        """``caller``'s load as of ``now``; replaces its previous report."""
        previous = self._reports.pop(caller, None)
        if previous is not None:
            self._take(previous[1])
        # Kept under the book's own key objects: the report's keys were just unpickled,
        # and keeping them would move hundreds of objects a second into the garbage
        # collector's oldest generation (longer full collections, more often).
        kept: Loads = {}
        for deployment, load in loads.items():
            key = self._keys.setdefault(deployment, deployment)
            kept[key] = load
            self._totals[key] = self._totals.get(key, 0.0) + load
            self._reporters[key] = self._reporters.get(key, 0) + 1
        self._reports[caller] = (now, kept)  # re-inserted: the dict stays in report order

    def total(self, deployment: DeploymentID, now: float) -> float:
        """The summed load of ``deployment`` over the callers heard from within the TTL."""
        self._expire(now)
        return self._totals.get(deployment, 0.0)

    def callers(self) -> int:
        """Callers whose report still counts (as of the last ``total``)."""
        return len(self._reports)

    def _expire(self, now: float) -> None:
        while self._reports:
            caller, (at, loads) = next(iter(self._reports.items()))
            if now - at <= self.ttl_s:
                return
            del self._reports[caller]
            self._take(loads)

    def _take(self, loads: Loads) -> None:
        for deployment, load in loads.items():
            left = self._reporters[deployment] - 1
            if left:
                self._reporters[deployment] = left
                self._totals[deployment] -= load
            else:
                del self._reporters[deployment], self._totals[deployment], self._keys[deployment]
