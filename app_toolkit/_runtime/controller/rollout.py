"""Canary rollouts: move an application's traffic to a canary step by step, and back at
once when the canary's error rate or latency crosses its bound. Pure: the controller
feeds it the callers' reports and the clock, and applies the weights it asks for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from app_toolkit._runtime.messages import AppSpec
from app_toolkit._runtime.tables import VariantOutcome
from app_toolkit.config import RolloutOptions
from app_toolkit.exceptions import ConfigError
from app_toolkit.metrics import SECONDS_BUCKETS, quantile

State = Literal["RUNNING", "DONE", "ROLLED_BACK", "STOPPED"]
#: What a step of the rollout asks the controller to do.
Change = Literal["step", "done", "rollback"]

#: Canary requests a step needs before its error rate and p99 are judged.
MIN_REQUESTS = 20
_BOUNDS = (*SECONDS_BUCKETS, math.inf)


@dataclass
class Rollout:
    """One rollout of ``endpoint``'s traffic to ``canary``."""

    endpoint: str
    canary: str
    steps: tuple[float, ...]  # percent of the traffic to the canary, step by step
    interval_s: float
    max_error_rate: float | None
    max_p99_ms: float | None
    started: float  # controller clock
    step: int = 0
    step_started: float = 0.0
    state: State = "RUNNING"
    reason: str = ""
    # The canary's requests in the current step.
    requests: int = 0
    errors: int = 0
    counts: list[int] = field(default_factory=lambda: [0] * len(_BOUNDS))
    history: list[str] = field(default_factory=list)

    def weights(self) -> dict[str, float]:
        """The split this rollout wants now."""
        if self.state == "DONE":
            return {self.canary: 100.0}
        if self.state in ("ROLLED_BACK", "STOPPED"):
            return {self.endpoint: 100.0}
        share = self.steps[self.step]
        return {self.endpoint: 100.0 - share, self.canary: share}

    def p99_ms(self) -> float | None:
        cumulative, total = [], 0
        for bound, count in zip(_BOUNDS, self.counts, strict=True):
            total += count
            cumulative.append((bound, float(total)))
        found = quantile(cumulative, 0.99)
        return None if found is None else found * 1000

    def record(self, outcome: VariantOutcome) -> None:
        """A caller's report of the canary's requests."""
        if self.state != "RUNNING" or outcome.endpoint != self.endpoint or outcome.variant != self.canary:
            return
        self.requests += outcome.requests
        self.errors += outcome.errors
        for index, count in enumerate(outcome.latency_counts[: len(self.counts)]):
            self.counts[index] += count

    def advance(self, now: float) -> Change | None:
        """Roll back if the canary crossed a bound; else go to the next step once this
        one has lasted ``interval_s``. None: nothing to change."""
        if self.state != "RUNNING":
            return None
        crossed = self._crossed()
        if crossed:
            self.state, self.reason = "ROLLED_BACK", crossed
            self.history.append(f"rolled back at {self.steps[self.step]:g} %: {crossed}")
            return "rollback"
        if now - self.step_started < self.interval_s:
            return None
        self.history.append(f"{self.steps[self.step]:g} %: {self._summary()}")
        if self.step + 1 == len(self.steps):
            self.state = "DONE"
            return "done"
        self.step += 1
        self.step_started = now
        self.requests = self.errors = 0
        self.counts = [0] * len(_BOUNDS)
        return "step"

    def stop(self, why: str) -> None:
        if self.state == "RUNNING":
            self.state, self.reason = "STOPPED", why
            self.history.append(f"stopped at {self.steps[self.step]:g} %: {why}")

    def _crossed(self) -> str:
        if self.requests < MIN_REQUESTS:
            return ""
        rate = self.errors / self.requests
        if self.max_error_rate is not None and rate > self.max_error_rate:
            return (
                f"error rate {rate:.1%} of {self.requests} canary requests is above "
                f"max_error_rate {self.max_error_rate:.1%}"
            )
        p99 = self.p99_ms()
        if self.max_p99_ms is not None and p99 is not None and p99 > self.max_p99_ms:
            return (
                f"p99 {p99:.0f} ms of {self.requests} canary requests is above max_p99_ms {self.max_p99_ms:g}"
            )
        return ""

    def _summary(self) -> str:
        p99 = self.p99_ms()
        latency = f", p99 {p99:.0f} ms" if p99 is not None else ""
        return f"{self.requests} canary requests, {self.errors} errors{latency}"


def new_rollout(
    endpoint: str, canary: str, options: RolloutOptions, apps: Mapping[str, AppSpec], now: float
) -> Rollout:
    """A checked rollout, at its first step. Raises ConfigError saying what to fix."""
    for name, what in ((endpoint, "application to roll out"), (canary, "canary")):
        if name not in apps:
            raise ConfigError(f"No {what} {name!r}: deploy it first")
    if canary == endpoint:
        raise ConfigError("The canary must be another application than the one rolled out")
    return Rollout(
        endpoint,
        canary,
        options.steps,
        options.interval_s,
        options.max_error_rate,
        options.max_p99_ms,
        started=now,
        step_started=now,
    )
