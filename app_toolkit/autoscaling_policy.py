"""What a custom autoscaling policy sees (Ray Serve's ``AutoscalingContext``).

A deployment's policy is a function ``policy(context) -> (replicas, policy_state)``; an
application's takes ``{DeploymentID: context}`` and returns
``({DeploymentID: replicas}, {DeploymentID: policy_state})``. Set one with
``autoscaling_config={"policy": {"policy_function": ...}}`` (docs/autoscaling.md). The
controller calls it about every 0.1 s, off its event loop, one call at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app_toolkit.config import AutoscalingConfig
from app_toolkit.deployment_id import DeploymentID

__all__ = ["AutoscalingContext", "DeploymentID", "TimeStampedValue"]


@dataclass(frozen=True, slots=True)
class TimeStampedValue:
    """One sample of a replica's custom metric: when (seconds on the controller's clock,
    as ``AutoscalingContext.current_time``) and its value."""

    timestamp: float
    value: float


@dataclass
class AutoscalingContext:
    """One deployment as its autoscaling policy sees it (Ray Serve's names).

    Times are seconds on the controller's clock (``current_time`` is now). Replicas are
    named by their replica ids. ``aggregated_metrics`` holds each replica's custom metrics
    (``record_autoscaling_stats()``) aggregated over ``look_back_period_s`` with the
    config's ``aggregation_function``; ``raw_metrics`` the samples themselves.
    ``total_queued_requests`` is None here: callers report requests queued and running
    together, as ``total_num_requests``.
    """

    deployment_id: DeploymentID
    deployment_name: str
    app_name: str | None
    current_num_replicas: int
    target_num_replicas: int
    running_replicas: list[str]
    total_num_requests: float
    total_queued_requests: float | None
    aggregated_metrics: dict[str, dict[str, float]]
    raw_metrics: dict[str, dict[str, list[TimeStampedValue]]]
    capacity_adjusted_min_replicas: int
    capacity_adjusted_max_replicas: int
    policy_state: dict[str, Any] = field(default_factory=dict)
    last_scale_up_time: float | None = None
    last_scale_down_time: float | None = None
    current_time: float | None = None
    config: AutoscalingConfig | None = None

    @property
    def total_running_requests(self) -> float:
        """Requests running (with queued ones where callers do not tell them apart)."""
        return self.total_num_requests - (self.total_queued_requests or 0.0)
