"""What status() says of a deployment, from the controller's records (pure)."""

from __future__ import annotations

from app_toolkit._runtime.controller.deployment_state import DeploymentState
from app_toolkit._runtime.controller.replica_state import SLOW_START_S, Replica
from app_toolkit._runtime.controller.status_view import deployment_status
from app_toolkit._runtime.messages import DeploymentID, DeploymentSpec
from app_toolkit.config import DeploymentConfig
from app_toolkit.status import DeploymentStatus, ReplicaState


def _state(**options: object) -> DeploymentState:
    config = DeploymentConfig(num_replicas=2, **options)  # type: ignore[arg-type]
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
