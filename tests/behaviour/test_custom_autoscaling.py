"""Custom autoscaling policies on replica-reported metrics, end to end: a deployment's
policy, an application's policy over two deployments, aggregation by max, and a policy
that fails while the deployment keeps serving."""

from __future__ import annotations

from typing import Any

import app_toolkit as tk
from tests.apps import policies
from tests.conftest import Toolkit
from tests.waiting import wait_for

#: Decisions apply at once; replicas sample their metric every 0.1 s.
FAST: dict[str, Any] = {
    "min_replicas": 1,
    "max_replicas": 3,
    "upscale_delay_s": 0,
    "downscale_delay_s": 0,
    "look_back_period_s": 0.5,
    "metrics_interval_s": 0.1,
}


def _deployment(app: str, name: str) -> tk.DeploymentStatusInfo:
    return tk.status().applications[app].deployments[name]


def test_a_policy_scales_on_a_metric_the_replicas_report(toolkit: Toolkit) -> None:
    """1 -> 3 -> 1 replicas as the metric moves: set on one replica, then on all of them."""
    name = toolkit.name()
    # --8<-- [start:options]
    app = policies.GAUGE.options(
        autoscaling_config={**FAST, "policy": {"policy_function": policies.scale_on_metric}}
    ).bind()
    # --8<-- [end:options]
    handle = toolkit.run(app, name=name, route_prefix=None)
    assert _deployment(name, "Gauge").running_replicas == 1
    handle.set.remote(3).result()
    wait_for(lambda: _deployment(name, "Gauge").running_replicas == 3, 30, "3 replicas for wanted=3")
    scaling = _deployment(name, "Gauge").autoscaling
    assert scaling is not None and scaling.policy == "tests.apps.policies:scale_on_metric"
    assert scaling.last_decision_metrics is not None and scaling.last_decision_to == 3
    # What the policy saw: the time-weighted mean of 1 then 3 over the look-back, above 2
    # (it rounds up to 3 replicas).
    assert 2 < max(scaling.last_decision_metrics["wanted"].values()) <= 3
    handle.broadcast("set", 1).results()
    wait_for(
        lambda: (
            _deployment(name, "Gauge").target_replicas == 1
            and _deployment(name, "Gauge").running_replicas == 1
        ),
        30,
        "back to 1 replica for wanted=1",
    )


def test_an_application_policy_scales_two_deployments_together_on_the_max(toolkit: Toolkit) -> None:
    """The application's policy gives both deployments the Front's largest "wanted"; with
    aggregation_function="max" over a long look-back, a value that fell keeps counting."""
    name = toolkit.name()
    held = {**FAST, "look_back_period_s": 60, "aggregation_function": "max"}
    back = policies.GAUGE.options(name="Back", autoscaling_config=held).bind()
    front = policies.GAUGE.options(name="Front", autoscaling_config=held).bind(back)
    handle = toolkit.run(
        front, name=name, route_prefix=None, autoscaling_policy="tests.apps.policies:together"
    )
    handle.set.remote(2).result()

    def both(replicas: int) -> bool:
        return all(_deployment(name, d).running_replicas == replicas for d in ("Front", "Back"))

    wait_for(lambda: both(2), 30, "2 replicas of each for Front's wanted=2")
    handle.broadcast("set", 1).results()

    def fell_but_max_holds() -> bool:
        scaling = _deployment(name, "Front").autoscaling
        assert scaling is not None
        latest, seen = scaling.latest_metrics.get("wanted", {}), scaling.metrics.get("wanted", {})
        return bool(latest) and set(latest.values()) == {1.0} and max(seen.values()) == 2.0

    wait_for(fell_but_max_holds, 30, "the newest samples at 1, their max over the look-back still 2")
    assert both(2) and _deployment(name, "Back").autoscaling.policy == "tests.apps.policies:together"  # type: ignore[union-attr]


def test_a_misbehaving_policy_keeps_the_last_decision_serving_and_says_why(toolkit: Toolkit) -> None:
    """A policy that answers a string, raises, answers -5 (clamped to min_replicas) and
    hangs past its 10 s bound (waited out on the local backend only): the deployment serves
    on with its last decision, and status() says what went wrong until a good answer
    clears it."""
    name = toolkit.name()
    policy = {"policy_function": "tests.apps.policies:misbehaves"}
    handle = toolkit.run(
        policies.GAUGE.options(autoscaling_config={**FAST, "policy": policy}).bind(),
        name=name,
        route_prefix=None,
    )

    def says(text: str) -> bool:
        return text in _deployment(name, "Gauge").message

    def act(behaviour: int) -> None:
        handle.broadcast("set", behaviour).results(timeout_s=30)  # every replica reports it

    act(policies.ANSWERS_STRING)
    wait_for(lambda: says("returned ('three', {}), not (replicas, policy_state)"), 30, "the string's error")
    act(policies.RAISES)
    wait_for(lambda: says("raised ValueError: the metrics service is down"), 30, "the raised error")
    assert handle.set.remote(policies.RAISES).result(timeout_s=30)  # it serves on
    assert _deployment(name, "Gauge").target_replicas == 1 and says("keeping 1 replica(s)")
    act(policies.SCALES_TO_2)  # a good answer: the message goes
    wait_for(lambda: _deployment(name, "Gauge").running_replicas == 2, 60, "2 replicas")
    assert _deployment(name, "Gauge").message == ""
    act(policies.ANSWERS_MINUS_5)
    wait_for(lambda: _deployment(name, "Gauge").target_replicas == 1, 30, "-5 clamped to min_replicas (1)")
    assert _deployment(name, "Gauge").message == ""  # a clamped answer is an answer, not an error
    if toolkit.backend != "local":
        return  # the hang's bound is the controller's own code, the same on Ray: its 10 s once
    act(policies.HANGS)
    wait_for(lambda: says("did not answer within 10 s"), 40, "the hung call reported")
    assert handle.set.remote(policies.HANGS).result(timeout_s=30)
    assert _deployment(name, "Gauge").target_replicas == 1
