"""The autoscaling policy: load samples in, a target replica count out. Pure (no clock,
no I/O): the controller passes the time and the load, so tests drive it with a fake clock.

The built-in policy divides the load by ``target_ongoing_requests``; a custom policy
(controller/custom_scaling.py runs it) says how many replicas it wants instead, and
``follow`` applies Ray Serve's factors, rounding, bounds and delays to that answer.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

from app_toolkit.config import AutoscalingConfig

#: Within this fraction of the target load per replica, the replica count is right: small
#: wobbles of a steady load never trigger a decision.
TOLERANCE = 0.1


#: Custom metrics: metric name -> replica id -> value.
Metrics = dict[str, dict[str, float]]


@dataclass(frozen=True)
class Decision:
    """One change of the target, for status and logs."""

    at: float  # controller clock
    load: float  # aggregated load that drove it
    from_replicas: int
    to_replicas: int
    #: A custom policy's decision: the custom metrics it saw (aggregated per replica).
    metrics: Metrics | None = None


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
    #: A custom policy's import path (its deployment's or its application's); None: built-in.
    policy: str | None = None
    #: What keeps the custom policy's decisions from applying ("" while it answers).
    problem: str = ""
    #: The custom metrics the policy saw at its last call (aggregated), and the newest samples.
    seen: Metrics = field(default_factory=dict)
    latest: Metrics = field(default_factory=dict)
    #: The custom policy's own state, handed back to it on its next call.
    policy_state: dict[str, object] = field(default_factory=dict)
    last_scale_up_at: float | None = None
    last_scale_down_at: float | None = None
    # The samples' sum, kept as they come and go (the average is read on every pass),
    # and how many are non-zero: with none, the average is exactly 0, never a residue.
    _sum: float = field(default=0.0, repr=False)
    _non_zero: int = field(default=0, repr=False)
    # With aggregation_function max or min: the samples that may still be the extreme,
    # oldest first (each later one is smaller for max, larger for min).
    _extremes: collections.deque[tuple[float, float]] = field(default_factory=collections.deque, repr=False)

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
        aggregation = self.config.aggregation_function
        if aggregation != "mean":
            extremes = self._extremes
            while extremes and (extremes[-1][1] <= load if aggregation == "max" else extremes[-1][1] >= load):
                extremes.pop()
            extremes.append((now, load))
            while extremes[0][0] < horizon:
                extremes.popleft()

    def average_load(self) -> float:
        """The load over ``look_back_period_s``, aggregated by ``aggregation_function``
        (mean, max or min of the samples)."""
        if not self._non_zero:
            return 0.0
        if self.config.aggregation_function != "mean":
            return self._extremes[0][1] if self._extremes else 0.0
        return self._sum / len(self.samples)

    def step(self, now: float, current_load: float | None = None) -> int:
        """Move the target if the load has asked for it long enough; returns the target.

        ``current_load`` is the newest load: demand while at zero replicas scales up at
        once, without waiting for an average to build up.
        """
        load = self.average_load()
        if self.target == 0 and current_load:
            load = max(load, current_load)
        return self._move(now, desired_replicas(self.config, load, self.target, self.limits()), load)

    def follow(self, now: float, wanted: float, running: int, metrics: Metrics | None = None) -> int:
        """Move the target toward a custom policy's answer ``wanted`` (replicas, maybe
        fractional or out of bounds), as Ray Serve applies its config to a custom policy:
        the scaling factors on the step from the ``running`` replicas, rounded up, within
        the bounds, after the delays. Returns the target."""
        self.problem = ""
        if metrics is not None:
            self.seen = metrics
        desired = scaled_step(self.config, wanted, running)
        lower, upper = self.limits()
        desired = max(lower, min(upper, desired))
        if desired == 0 and self.target > 1:
            desired = 1  # to zero only from one replica, as Ray Serve's delays go
        return self._move(now, desired, self.average_load(), metrics)

    def cold_start(self, now: float, current_load: float) -> int:
        """A custom policy's deployment with no replica running: demand at zero replicas
        starts one at once (the policy is not asked); otherwise the target holds."""
        if self.target == 0 and current_load > 0:
            lower, upper = self.limits()
            first = max(lower, min(upper, max(1, math.ceil(self.config.upscale_factor))))
            self._decide(now, max(self.average_load(), current_load), first)
        return self.target

    def _move(self, now: float, desired: int, load: float, metrics: Metrics | None = None) -> int:
        """Take ``desired`` once it has been wanted for the delay of its direction."""
        config = self.config
        if desired > self.target:
            self.wants_fewer_since = None
            if self.wants_more_since is None:
                self.wants_more_since = now
            if self.target == 0 or now - self.wants_more_since >= config.upscale_delay_s:
                self._decide(now, load, desired, metrics)
        elif desired < self.target:
            self.wants_more_since = None
            if self.wants_fewer_since is None:
                self.wants_fewer_since = now
            delay = config.downscale_delay_s
            if desired == 0 and config.downscale_to_zero_delay_s is not None:
                delay = config.downscale_to_zero_delay_s
            if now - self.wants_fewer_since >= delay:
                self._decide(now, load, desired, metrics)
        else:
            self.wants_more_since = self.wants_fewer_since = None
        return self.target

    def _decide(self, now: float, load: float, desired: int, metrics: Metrics | None = None) -> None:
        self.last_decision = Decision(now, load, self.target, desired, metrics)
        if desired > self.target:
            self.last_scale_up_at = now
        else:
            self.last_scale_down_at = now
        self.target = desired
        self.wants_more_since = self.wants_fewer_since = None


def scaled_step(config: AutoscalingConfig, wanted: float, current: int) -> int:
    """A custom policy's answer as Ray Serve turns it into replicas: the step from
    ``current`` times the factor of its direction, rounded up; a downscale the factor
    would round away still removes one replica."""
    step = wanted - current
    factor = config.upscale_factor if step > 0 else config.downscale_factor
    return _unstuck(wanted, current, math.ceil(current + factor * step))


def _unstuck(wanted: float, current: int, stepped: int) -> int:
    """``stepped``, or one replica less when it is ``current`` but ``wanted`` is fewer: a
    downscale factor below 1 would round the step away for ever (from 1 to 0 with no load
    at all), so Ray Serve removes one replica when it is stuck."""
    if stepped == current and math.ceil(wanted) < current:
        return current - 1
    return stepped


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
        factor = config.upscale_factor
        desired = current + math.ceil((ideal - current) * factor)
    else:
        factor = config.downscale_factor
        # Removing a replica needs the load to fit the rest: ceil, never floor.
        desired = _unstuck(ideal, current, current - math.floor((current - ideal) * factor))
        if load > 0:
            desired = max(desired, 1)
    lower, upper = limits or (config.min_replicas, config.max_replicas)
    return max(lower, min(upper, desired))
