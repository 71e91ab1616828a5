"""A deployment's records (pure): what status() says of it, and when plan() is due."""

from __future__ import annotations

import math

from app_toolkit._runtime.controller.deployment_state import (
    DeploymentState,
    StartReplica,
    apply_event,
    follow_autoscaling,
    new_spec,
)
from app_toolkit._runtime.controller.planning import next_due, plan
from app_toolkit._runtime.controller.replica_state import SLOW_START_S, CheckHealth, Replica, Started
from app_toolkit._runtime.controller.status_view import deployment_status
from app_toolkit._runtime.messages import DeploymentID, DeploymentSpec, ReplicaInfo
from app_toolkit.config import DeploymentConfig
from app_toolkit.status import DeploymentStatus, ReplicaState


def _state(**options: object) -> DeploymentState:
    config = DeploymentConfig(num_replicas=2, **options)
    spec = DeploymentSpec(DeploymentID("a", "D"), b"def", b"args", config, True, "v1")
    return DeploymentState(
        spec,
        {
            "old": Replica("old", "v1", ReplicaState.RUNNING, launched_at=0.0),
            "new": Replica("new", "v1", launched_at=100.0),
        },
    )


def test_replicas_slow_to_start_are_explained_with_what_they_ask_for() -> None:
    state = _state(ray_actor_options={"num_cpus": 4, "resources": {"accelerator": 1}})
    assert deployment_status(state, 0.0, now=100 + SLOW_START_S - 1).message == ""
    info = deployment_status(state, 0.0, now=100 + SLOW_START_S + 1)
    assert info.status is DeploymentStatus.UPDATING
    assert info.message.startswith("1 replica(s) starting for more than 30 s")
    assert "each needs num_cpus=4.0, resources={'accelerator': 1.0}" in info.message


def test_a_failure_message_comes_before_the_slow_start_hint() -> None:
    state = _state()
    state.message = "Replica failed to start: ValueError: boom"
    assert deployment_status(state, 0.0, now=1000).message == state.message
    state.message = ""
    assert "no reserved resources" in deployment_status(state, 0.0, now=1000).message


# ----------------------------------------------------------------------------- next_due


def _planned(state: DeploymentState, now: float) -> list[object]:
    ids = (f"r{n}" for n in range(100))
    return list(plan(state, now, lambda: next(ids)))


def test_plan_has_nothing_to_do_until_next_due_and_a_health_check_then() -> None:
    config = DeploymentConfig(num_replicas=3, health_check_period_s=10.0)
    state = DeploymentState(DeploymentSpec(DeploymentID("a", "D"), b"def", b"args", config, True, "v1"))
    starts = [a for a in _planned(state, now=0.0) if isinstance(a, StartReplica)]
    assert len(starts) == 3
    assert next_due(state) == SLOW_START_S  # nothing runs yet: only a slow start could come
    for offset, start in enumerate(starts):  # they come up at 1, 2 and 3 s
        info = ReplicaInfo(start.replica_id, state.spec.id, "127.0.0.1", 1, b"t", 5, rank=start.rank)
        apply_event(state, start.replica_id, Started(info, start.replica_id, config), now=1.0 + offset)
    checks_at = sorted(r.next_health_check for r in state.replicas.values())
    assert next_due(state) == checks_at[0]  # the earliest first check
    for now in (3.0, 4.5, checks_at[0] - 0.001):
        before = dict(state.replicas)
        assert _planned(state, now) == []
        assert state.replicas == before
    checks = _planned(state, now=checks_at[0])
    assert [type(a) for a in checks] == [CheckHealth]
    assert next_due(state) == checks_at[1]  # the one being checked waits for its outcome (an event)


def test_next_due_of_a_deployment_going_away_is_every_pass_and_of_an_idle_one_never() -> None:
    state = _state()
    state.replicas["old"] = Replica("old", "v1", ReplicaState.RUNNING, next_health_check=200.0)
    assert next_due(state) == 100.0 + SLOW_START_S  # "new" turns slow before "old" is due
    state.replicas["new"] = Replica("new", "v1", launched_at=100.0, slow_start_logged=True)
    assert next_due(state) == 200.0
    state.replicas["old"] = Replica("old", "v1", ReplicaState.STOPPING)
    assert next_due(state) == math.inf  # waits for events only
    state.deleting = True
    assert next_due(state) == -math.inf


def test_a_redeploy_with_a_new_initial_replicas_starts_from_it_and_other_changes_keep_the_count() -> None:
    """Ray Serve's rule for a changed initial_replicas; any other change to the
    autoscaling config keeps the replicas the autoscaler had decided."""

    def autoscaled(**autoscaling: object) -> DeploymentSpec:
        config = DeploymentConfig(autoscaling_config={"min_replicas": 1, "max_replicas": 8, **autoscaling})
        return DeploymentSpec(DeploymentID("a", "D"), b"def", b"args", config, True, "v1")

    state = DeploymentState(autoscaled(initial_replicas=2))
    follow_autoscaling(state)
    assert state.target == 2
    assert state.autoscaler is not None
    state.autoscaler.hold(5)  # the autoscaler moved it
    new_spec(state, autoscaled(initial_replicas=2, max_replicas=7))
    assert state.target == 5
    new_spec(state, autoscaled(initial_replicas=3, max_replicas=7))
    assert state.target == 3
