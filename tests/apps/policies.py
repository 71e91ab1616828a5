"""Custom autoscaling policies, and a deployment that reports the metric they scale on."""

from __future__ import annotations

import math
from typing import Any

import app_toolkit as tk


# --8<-- [start:policy]
def scale_on_metric(context: tk.AutoscalingContext) -> tuple[float, dict[str, Any]]:
    """As many replicas as the largest "wanted" any replica reports (aggregated)."""
    wanted = context.aggregated_metrics.get("wanted", {})
    calls = int(context.policy_state.get("calls", 0)) + 1
    return (max(wanted.values()) if wanted else context.target_num_replicas), {"calls": calls}


# --8<-- [end:policy]


def hold(context: tk.AutoscalingContext) -> tuple[int, dict[str, Any]]:
    """Keeps the target as it is (the metrics it saw show in status())."""
    return context.target_num_replicas, {}


def raises(context: tk.AutoscalingContext) -> tuple[int, dict[str, Any]]:
    raise ValueError("the metrics service is down")


# --8<-- [start:application]
def together(
    contexts: dict[tk.autoscaling_policy.DeploymentID, tk.AutoscalingContext],
) -> tuple[dict[Any, float], dict[Any, dict[str, Any]]]:
    """An application's policy: every deployment gets as many replicas as the largest
    "wanted" any replica of the ingress ("Front") reports."""
    front = next(context for deployment, context in contexts.items() if deployment.name == "Front")
    wanted = max(front.aggregated_metrics.get("wanted", {}).values(), default=front.target_num_replicas)
    return {deployment: math.ceil(wanted) for deployment in contexts}, {}


# --8<-- [end:application]


# --8<-- [start:metric]
class Gauge:
    """Reports the metric "wanted", which a call sets (on one replica, or broadcast)."""

    def __init__(self, helper: tk.DeploymentHandle | None = None) -> None:
        self.wanted = 1.0
        self.helper = helper

    def set(self, wanted: float) -> str:
        self.wanted = wanted
        return tk.get_replica_context().replica_id

    def record_autoscaling_stats(self) -> dict[str, float]:
        return {"wanted": self.wanted}


GAUGE = tk.deployment(Gauge)  # (not a class decorator: mypy reads those as the class)
# --8<-- [end:metric]
