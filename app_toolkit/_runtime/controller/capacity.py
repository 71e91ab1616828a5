"""``target_capacity``: a config file's share of every deployment's replicas, as Ray Serve
scales them. Pure.

A count ``n`` at capacity ``c`` percent becomes ``round_half_up(n * c / 100)``, at least 1
unless ``n`` or ``c`` is 0; no capacity (None) or 100 leaves it as it is. An autoscaled
deployment's bounds scale the same way; its lower bound is the scaled ``initial_replicas``
while the capacity goes up (so a fleet coming back starts where it should), else the
scaled ``min_replicas``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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

    def change_from(self, before: Capacity) -> str:
        """The lifecycle line of a change to this capacity (as Ray Serve words it)."""
        if self.percent is None:
            return "Target capacity entering 100% at steady state."
        direction = "up" if self.rising else "down"
        return f"Target capacity scaling {direction} from {before.percent} to {self.percent}."

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


def file_capacity(
    before: Mapping[str, object] | None, current: Capacity, after: Mapping[str, object]
) -> Capacity:
    """The capacity config file ``after`` sets, applied where ``before`` (the file applied
    last, None for none) set ``current``."""

    def names(file: Mapping[str, object] | None) -> list[str]:
        applications = file.get("applications", []) if file is not None else []
        return (
            [str(app.get("name", "default")) for app in applications]
            if isinstance(applications, list)
            else []
        )

    percent = after.get("target_capacity")
    wanted = float(percent) if isinstance(percent, int | float) else None
    return next_capacity(current if before is not None else None, names(before), wanted, names(after))
