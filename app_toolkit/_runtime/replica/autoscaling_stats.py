"""A replica's custom autoscaling metrics: the user's ``record_autoscaling_stats()``.

Ray Serve's hook: a deployment class may define ``record_autoscaling_stats(self)``, sync
or async, returning ``dict[str, float]``. The replica calls it every
``metrics_interval_s`` (of its autoscaling config) while the deployment autoscales, each
call bounded by ``STATS_TIMEOUT_S`` (``hook_sampler.py``: one call at a time, problems
logged once and skipped). The samples wait here until the process's next load report
takes them to the controller (``TableSubscriber.add_stats``: the same report, no channel
of its own).
"""

from __future__ import annotations

import asyncio
import math
import numbers
from collections import deque

from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.replica.hook_sampler import StatsHook
from app_toolkit._runtime.tables import ReplicaStats
from app_toolkit.config import DeploymentConfig

#: How long one call may take (Ray Serve's RAY_SERVE_RECORD_AUTOSCALING_STATS_TIMEOUT_S).
STATS_TIMEOUT_S = 10.0
#: Samples kept for the next report at most (a report that is slow to come: a caller's
#: report loop paced by its load, or held up by a slow controller).
_KEPT = 100


class AutoscalingStats(StatsHook):
    """Samples one replica's ``record_autoscaling_stats()`` while its deployment autoscales
    (``metrics_interval_s`` apart; autoscaling turned off in place pauses the calls); owns
    its sampler."""

    METHOD = "record_autoscaling_stats"
    SKIPPED = "its custom metrics skip this sample"

    def __init__(
        self, instance: object, replica_id: str, deployment: DeploymentID, config: DeploymentConfig
    ) -> None:
        self._samples: deque[tuple[float, tuple[tuple[str, float], ...]]] = deque(maxlen=_KEPT)
        super().__init__(instance, replica_id, deployment, config)

    def take(self) -> ReplicaStats | None:
        """The samples since the last take, each with its age now (None: there are none)."""
        if not self._samples:
            return None
        now = asyncio.get_running_loop().time()
        samples = tuple((now - at, values) for at, values in self._samples)
        self._samples.clear()
        return ReplicaStats(self.replica_id, self.deployment, samples)

    def _schedule(self) -> tuple[float, float] | None:
        autoscaling = self.config.autoscaling_config
        if autoscaling is None:  # not autoscaled (now): nobody reads them
            return None
        return autoscaling.metrics_interval_s, STATS_TIMEOUT_S

    def _keep(self, value: object, now: float) -> str:
        values = _metrics(value)
        if values is None:
            return f"returned {value!r:.60}, not a dict of metric names to numbers"
        self._samples.append((now, values))
        return ""


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
