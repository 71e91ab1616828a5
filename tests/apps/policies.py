"""Custom autoscaling policies, and a deployment that reports the metric they scale on."""

from __future__ import annotations

import math
import time
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


#: What ``misbehaves`` does for each newest "wanted" a replica reports.
ANSWERS_STRING, RAISES, SCALES_TO_2, ANSWERS_MINUS_5, HANGS = 1, 2, 3, 4, 5


def misbehaves(context: tk.AutoscalingContext) -> tuple[object, dict[str, Any]]:
    """Misbehaves as the newest "wanted" of any replica says (the constants above): a
    test moves it from one failure to the next."""
    newest = [samples[-1].value for samples in context.raw_metrics.get("wanted", {}).values() if samples]
    wanted = max(newest, default=0)
    if wanted == ANSWERS_STRING:
        return "three", {}
    if wanted == RAISES:
        raise ValueError("the metrics service is down")
    if wanted == SCALES_TO_2:
        return 2, {}
    if wanted == ANSWERS_MINUS_5:
        return -5, {}
    if wanted == HANGS:
        time.sleep(12)  # past the controller's 10 s bound; its thread ends by itself
    return context.target_num_replicas, {}


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
