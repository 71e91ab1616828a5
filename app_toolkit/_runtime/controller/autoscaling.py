"""The autoscaling policy: load samples in, a target replica count out. Pure (no clock,
no I/O): the controller passes the time and the load, so tests drive it with a fake clock.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

from app_toolkit.config import AutoscalingConfig

#: Within this fraction of the target load per replica, the replica count is right: small
#: wobbles of a steady load never trigger a decision.
TOLERANCE = 0.1


@dataclass(frozen=True)
class Decision:
    """One change of the target, for status and logs."""

    at: float  # controller clock
    load: float  # averaged load that drove it
    from_replicas: int
    to_replicas: int


@dataclass
class Autoscaler:
    """The target replica count of one deployment, moved by its load over time."""

    config: AutoscalingConfig
    target: int
    #: The bounds the target stays within: the config's, or scaled by a target_capacity
    #: (controller/capacity.py); None: the config's.
    bounds: tuple[int, int] | None = None
    samples: collections.deque[tuple[float, float]] = field(default_factory=collections.deque)
    wants_more_since: float | None = None
    wants_fewer_since: float | None = None
    last_decision: Decision | None = None
    # The samples' sum, kept as they come and go (the average is read on every pass),
    # and how many are non-zero: with none, the average is exactly 0, never a residue.
    _sum: float = field(default=0.0, repr=False)
    _non_zero: int = field(default=0, repr=False)

    @classmethod
    def start(cls, config: AutoscalingConfig) -> Autoscaler:
        return cls(config, config.start_replicas)

    def limits(self) -> tuple[int, int]:
        """(lower, upper): what the target stays within."""
        return self.bounds or (self.config.min_replicas, self.config.max_replicas)

    def hold(self, replicas: int) -> None:
        """Set the target to ``replicas`` within its bounds (no decision)."""
        lower, upper = self.limits()
        self.target = max(lower, min(upper, replicas))

    def bound(self, bounds: tuple[int, int] | None) -> None:
        """Keep the target within ``bounds`` from now on (None: the config's)."""
        self.bounds = bounds
        self.hold(self.target)

    def record(self, now: float, load: float) -> None:
        """Add a load sample (requests queued + running over all callers)."""
        self.samples.append((now, load))
        self._sum += load
        self._non_zero += load != 0
        horizon = now - self.config.look_back_period_s
        while self.samples and self.samples[0][0] < horizon:
            _, old = self.samples.popleft()
            self._sum -= old
            self._non_zero -= old != 0
        if not self._non_zero:
            self._sum = 0.0

    def average_load(self) -> float:
        if not self._non_zero:
            return 0.0
        return self._sum / len(self.samples)

    def step(self, now: float, current_load: float | None = None) -> int:
        """Move the target if the load has asked for it long enough; returns the target.

        ``current_load`` is the newest load: demand while at zero replicas scales up at
        once, without waiting for an average to build up.
        """
        config = self.config
        load = self.average_load()
        if self.target == 0 and current_load:
            load = max(load, current_load)
        desired = desired_replicas(config, load, self.target, self.limits())
        if desired > self.target:
            self.wants_fewer_since = None
            if self.wants_more_since is None:
                self.wants_more_since = now
            if self.target == 0 or now - self.wants_more_since >= config.upscale_delay_s:
                self._decide(now, load, desired)
        elif desired < self.target:
            self.wants_more_since = None
            if self.wants_fewer_since is None:
                self.wants_fewer_since = now
            delay = config.downscale_delay_s
            if desired == 0 and config.downscale_to_zero_delay_s is not None:
                delay = config.downscale_to_zero_delay_s
            if now - self.wants_fewer_since >= delay:
                self._decide(now, load, desired)
        else:
            self.wants_more_since = self.wants_fewer_since = None
        return self.target

    def _decide(self, now: float, load: float, desired: int) -> None:
        self.last_decision = Decision(now, load, self.target, desired)
        self.target = desired
        self.wants_more_since = self.wants_fewer_since = None


def desired_replicas(
    config: AutoscalingConfig, load: float, current: int, limits: tuple[int, int] | None = None
) -> int:
    """Replicas for ``load`` at ``target_ongoing_requests`` each, stepped by the scaling
    factors and kept within ``limits`` (default [min_replicas, max_replicas])."""
    ideal = load / config.target_ongoing_requests
    if current == 0:
        desired = math.ceil(ideal)
    elif abs(ideal / current - 1) <= TOLERANCE:
        desired = current
    elif ideal > current:
        factor = config.upscaling_factor or 1.0
        desired = current + math.ceil((ideal - current) * factor)
    else:
        factor = config.downscaling_factor or 1.0
        # Removing a replica needs the load to fit the rest: ceil, never floor.
        desired = current - math.floor((current - ideal) * factor)
        if load > 0:
            desired = max(desired, 1)
    lower, upper = limits or (config.min_replicas, config.max_replicas)
    return max(lower, min(upper, desired))
