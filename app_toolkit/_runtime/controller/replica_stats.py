"""Replicas' custom autoscaling metrics, as their reports arrive, over the look-back
window. Pure: ``now`` comes in.

Each replica's ``record_autoscaling_stats()`` samples reach the controller with the load
reports of its process (``ReplicaStats``). A policy sees, per metric and replica, the raw
samples: those of the last ``look_back_period_s``, beginning with the last one from
before it (a sample holds until the next, so that one is the value at the window's
start); and one value made of them by the config's ``aggregation_function``: the
time-weighted mean (each sample for as long as it held within the window, the last one
until now), the max or the min.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from app_toolkit._runtime.controller.autoscaling import Metrics
from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.tables import ReplicaStats
from app_toolkit.autoscaling_policy import TimeStampedValue
from app_toolkit.config import AutoscalingConfig

#: Metric name -> replica id -> its samples in the window.
RawMetrics = dict[str, dict[str, list[TimeStampedValue]]]
#: Samples beyond this many per replica are dropped, oldest first (a tiny
#: metrics_interval_s with a long look-back would hold the controller's memory).
MAX_SAMPLES = 1000


class StatsBook:
    """The custom metrics each replica reported, by deployment."""

    def __init__(self) -> None:
        self._samples: dict[DeploymentID, dict[str, collections.deque[tuple[float, dict[str, float]]]]] = {}

    def record(self, stats: ReplicaStats, now: float) -> None:
        replicas = self._samples.setdefault(stats.deployment, {})
        kept = replicas.setdefault(stats.replica_id, collections.deque(maxlen=MAX_SAMPLES))
        for age, values in sorted(stats.samples, key=lambda sample: -sample[0]):
            kept.append((now - max(age, 0.0), dict(values)))

    def holds(self, deployment: DeploymentID) -> bool:
        return deployment in self._samples

    def forget(self, deployment: DeploymentID) -> None:
        self._samples.pop(deployment, None)

    def window(
        self, deployment: DeploymentID, replicas: Iterable[str], config: AutoscalingConfig, now: float
    ) -> tuple[Metrics, RawMetrics, Metrics]:
        """The metrics of ``replicas`` (others are forgotten) over the look-back window:
        aggregated, raw, and the newest value of each. A sample holds until the next: the
        last one from before the window is the value at its start, so a replica whose
        report comes late is still seen, at the value it last had."""
        reported = self._samples.get(deployment, {})
        wanted = set(replicas)
        for gone in [replica for replica in reported if replica not in wanted]:
            del reported[gone]
        horizon = now - config.look_back_period_s
        aggregated: Metrics = {}
        raw: RawMetrics = {}
        latest: Metrics = {}
        for replica, samples in reported.items():
            while len(samples) > 1 and samples[1][0] <= horizon:
                samples.popleft()
            series: dict[str, list[TimeStampedValue]] = {}
            for at, values in samples:
                for name, value in values.items():
                    series.setdefault(name, []).append(TimeStampedValue(at, value))
            for name, points in series.items():
                raw.setdefault(name, {})[replica] = points
                aggregated.setdefault(name, {})[replica] = aggregate(
                    points, config.aggregation_function, now, since=horizon
                )
                latest.setdefault(name, {})[replica] = points[-1].value
        return aggregated, raw, latest


def aggregate(points: list[TimeStampedValue], function: str, now: float, since: float | None = None) -> float:
    """One value of ``points`` (oldest first, at least one) over the window from ``since``
    (default: the first point) to ``now``: max, min, or the mean weighted by how long each
    value held within it (the last one until ``now``; one from before ``since`` from then)."""
    if function == "max":
        return max(point.value for point in points)
    if function == "min":
        return min(point.value for point in points)
    start = points[0].timestamp if since is None else max(points[0].timestamp, since)
    span = now - start
    if span <= 0:
        return points[-1].value
    total = 0.0
    for point, after in zip(points, [*points[1:], None], strict=True):
        until = after.timestamp if after is not None else now
        total += point.value * (until - max(point.timestamp, start))
    return total / span
