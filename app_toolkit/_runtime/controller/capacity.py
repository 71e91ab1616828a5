"""``target_capacity``: a config file's share of every deployment's replicas, as Ray Serve
scales them. Pure.

A count ``n`` at capacity ``c`` percent becomes ``round_half_up(n * c / 100)``, at least 1
unless ``n`` or ``c`` is 0; no capacity (None) or 100 leaves it as it is. An autoscaled
deployment's bounds scale the same way; its lower bound is the scaled ``initial_replicas``
while the capacity goes up (so a fleet coming back starts where it should), else the
scaled ``min_replicas``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from app_toolkit.config import AutoscalingConfig


@dataclass(frozen=True, slots=True)
class Capacity:
    """The capacity a config file set (percent), and whether it is going up."""

    percent: float | None = None
    rising: bool = False

    def scale(self, count: int) -> int:
        """``count`` replicas at this capacity."""
        percent = self.percent
        if percent is None or percent == 100:
            return count
        if percent == 0 or count == 0:
            return 0
        scaled = (Decimal(count * percent) / 100).quantize(Decimal(1), rounding=ROUND_HALF_UP)
        return max(1, int(scaled))

    def bounds(self, config: AutoscalingConfig) -> tuple[int, int]:
        """An autoscaled deployment's (lower, upper) replica bounds at this capacity."""
        lower = config.min_replicas
        if self.rising and config.initial_replicas is not None:
            lower = config.initial_replicas
        return self.scale(lower), self.scale(config.max_replicas)


def next_capacity(
    before: Capacity | None, before_apps: Iterable[str], percent: float | None, apps: Iterable[str]
) -> Capacity:
    """The capacity a config file sets, with its direction as Ray Serve decides it: the
    same applications as the file before it compare their capacities (unchanged keeps the
    direction; higher is rising; lower, or a first one, is falling); other applications,
    or no file before, rise to any capacity."""
    if percent is None:
        return Capacity()
    if before is None or set(before_apps) != set(apps):
        return Capacity(percent, rising=True)
    if before.percent == percent:
        return before
    rising = before.percent is not None and percent > before.percent
    return Capacity(percent, rising)
