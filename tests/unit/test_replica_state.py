"""The replica lifecycle and deployment planning as pure transitions, on a fake clock."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import Any

from app_toolkit._runtime.controller.deployment_state import (
    MAX_START_FAILURES,
    DeploymentState,
    PublishGone,
    StartReplica,
    apply_event,
    hold_routing_stats,
    replica_table,
)
from app_toolkit._runtime.controller.planning import plan
from app_toolkit._runtime.controller.replica_state import (
    CancelStart,
    CheckHealth,
    HealthFailed,
    HealthPassed,
    Log,
    PublishReplicas,
    Reconfigured,
    ReconfigureFailed,
    ReconfigureReplica,
    Replace,
    Replica,
    Started,
    StartFailed,
    Stop,
    Stopped,
    StopReplica,
    Tick,
    drain_timeout_s,
    first_check_in,
    replica_transition,
)
from app_toolkit._runtime.messages import DeploymentID, DeploymentSpec, ReplicaInfo, StreamContinuation
from app_toolkit.config import DeploymentConfig
from app_toolkit.status import ReplicaState

#: How long a graceful stop of a replica with default options may take.
DRAIN_S = drain_timeout_s(DeploymentConfig())

D = DeploymentID("a", "D")


def spec(version: str = "v1", **options: Any) -> DeploymentSpec:
    config = DeploymentConfig(**{"num_replicas": 2, "health_check_period_s": 10.0, **options})
    return DeploymentSpec(D, b"def", b"args", config, True, version)


def info(replica_id: str, slots: int = 100) -> ReplicaInfo:
    return ReplicaInfo(replica_id, D, "127.0.0.1", 1, b"t", slots)


def running(replica_id: str = "r1", version: str = "v1", **fields: Any) -> Replica:
    config = spec(version).config
    return Replica(
        replica_id,
        version,
        ReplicaState.RUNNING,
        info(replica_id),
        f"h-{replica_id}",
        next_health_check=10.0,
        config=config,
        **fields,
    )


def ids() -> Any:
    counter = itertools.count(1)
    return lambda: f"n{next(counter)}"


# ------------------------------------------------------------------------ one replica


def test_a_started_replica_runs_and_is_published_with_its_first_check_within_a_period() -> None:
    starting = Replica("r1", "v1", launched_at=0.0)
    after, actions = replica_transition(starting, Started(info("r1"), "h", spec().config), spec(), now=5.0)
    assert after is not None and after.state is ReplicaState.RUNNING and after.serving
    period = spec().config.health_check_period_s
    assert after.next_health_check == 5.0 + first_check_in("r1", period) and after.handle == "h"
    assert actions == [PublishReplicas()]


def test_routing_stats_reported_before_the_start_is_told_go_into_its_table_entry() -> None:
    """A replica's first load report may reach the controller before the backend says it
    started: its stats wait in the record, not dropped (it sends them again only when
    they change, or half a minute later)."""
    state = DeploymentState(spec(num_replicas=1), {"s1": Replica("s1", "v1", launched_at=0.0)})
    assert not hold_routing_stats(state, "s1", '{"engine":"echo"}')  # no table entry yet
    assert not hold_routing_stats(state, "gone", "{}")  # a replica no longer known: dropped
    apply_event(state, "s1", Started(info("s1"), "h", state.spec.config), now=1.0)
    running_info = state.replicas["s1"].info
    assert running_info is not None and running_info.routing_stats == '{"engine":"echo"}'
    assert state.replicas["s1"].early_routing_stats == ""
    assert [entry.routing_stats for entry in replica_table(state).replicas] == ['{"engine":"echo"}']
    assert hold_routing_stats(state, "s1", '{"engine":"vllm"}')  # a change once it runs: a new table


def test_replicas_started_together_get_their_first_checks_spread_over_half_a_period() -> None:
    delays = [first_check_in(f"app.D.{n:06x}", 10.0) for n in range(2000)]
    assert all(5.0 <= delay <= 10.0 for delay in delays)
    assert first_check_in("app.D.000001", 10.0) == first_check_in("app.D.000001", 10.0)  # pure
    per_second = [sum(5.0 + s <= d < 6.0 + s for d in delays) for s in range(5)]
    assert all(300 <= count <= 500 for count in per_second), per_second  # ~400 each, no wave


def test_stop_while_starting_cancels_the_start_and_stops_one_that_finished_first() -> None:
    starting = Replica("r1", "v1")
    asked, actions = replica_transition(starting, Stop(), spec(), now=1.0)
    assert asked is not None and asked.stop_requested and asked.state is ReplicaState.STOPPING
    assert actions == [CancelStart("r1")]
    after, actions = replica_transition(asked, Started(info("r1"), "h", spec().config), spec(), now=2.0)
    assert after is not None and after.state is ReplicaState.STOPPING and not after.serving
    assert actions == [StopReplica("r1", "h", graceful=False)]
    gone, _ = replica_transition(after, Stopped(), spec(), now=3.0)
    assert gone is None


def test_stopping_a_running_replica_unpublishes_it_then_drains_it_once() -> None:
    after, actions = replica_transition(running(), Stop(), spec(), now=1.0)
    assert after is not None and after.state is ReplicaState.STOPPING
    assert actions == [PublishReplicas(), StopReplica("r1", "h-r1", graceful=True, drain_timeout_s=DRAIN_S)]
    again, more = replica_transition(after, Stop(), spec(), now=2.0)
    assert again == after and more == []


def test_health_checks_run_when_due_one_at_a_time() -> None:
    replica = running()
    same, actions = replica_transition(replica, Tick(), spec(), now=9.9)
    assert same == replica and actions == []
    checking, actions = replica_transition(replica, Tick(), spec(), now=10.0)
    assert actions == [CheckHealth("r1", "h-r1", 30.0)]
    assert checking is not None
    _, actions = replica_transition(checking, Tick(), spec(), now=11.0)
    assert actions == []  # the check under way is not doubled
    passed, _ = replica_transition(checking, HealthPassed(), spec(), now=12.0)
    assert passed is not None and not passed.checking and passed.next_health_check == 22.0


def test_a_replica_is_replaced_after_the_failure_threshold_and_passing_resets_the_count() -> None:
    replica = running()
    for attempt in range(2):
        after, actions = replica_transition(replica, HealthFailed("slow", gone=False), spec(), now=10.0)
        assert after is not None
        replica = after
        assert replica.health_failures == attempt + 1 and replica.serving
        assert [type(a) for a in actions] == [Log]
    reset, _ = replica_transition(replica, HealthPassed(), spec(), now=11.0)
    assert reset is not None and reset.health_failures == 0
    for _ in range(3):
        after, actions = replica_transition(reset, HealthFailed("slow", gone=False), spec(), now=20.0)
        assert after is not None
        reset = after
    assert not reset.serving and actions[-1] == StopReplica(
        "r1", "h-r1", graceful=True, drain_timeout_s=DRAIN_S
    )
    assert Replace("unhealthy") in actions
    # Failures after the stop was asked for are logged, not counted as another replacement.
    _, actions = replica_transition(reset, HealthFailed("slow", gone=False), spec(), now=30.0)
    assert [type(a) for a in actions] == [Log]


def test_a_replica_that_stops_answering_is_killed_not_drained() -> None:
    replica = dataclasses.replace(running(), config=DeploymentConfig(graceful_shutdown_timeout_s=3))
    for _ in range(3):
        after, actions = replica_transition(
            replica, HealthFailed("no answer", gone=False, hung=True), spec(), now=10.0
        )
        assert after is not None
        replica = after
    assert not replica.serving and actions[-1] == StopReplica(
        "r1", "h-r1", graceful=False, drain_timeout_s=16.0
    )
    assert Replace("hung") in actions


def test_a_replica_whose_process_is_gone_is_replaced_at_once() -> None:
    after, actions = replica_transition(running(), HealthFailed("actor died", gone=True), spec(), now=10.0)
    assert after is not None and after.state is ReplicaState.STOPPING
    assert actions[0] == Log(logging.WARNING, "Replica r1 is gone (actor died); replacing it")
    assert StopReplica("r1", "h-r1", graceful=True, drain_timeout_s=DRAIN_S) in actions
    assert Replace("gone") in actions


def test_changed_in_place_options_reconfigure_the_running_replica_once() -> None:
    wanted = spec(user_config={"x": 2}, max_ongoing_requests=7)
    replica = running()
    busy, actions = replica_transition(replica, Tick(), wanted, now=1.0)
    assert actions == [ReconfigureReplica("r1", "h-r1", wanted.config)]
    assert busy is not None
    _, actions = replica_transition(busy, Tick(), wanted, now=2.0)
    assert actions == []
    done, actions = replica_transition(busy, Reconfigured(wanted.config), wanted, now=3.0)
    assert done is not None and done.config == wanted.config
    assert done.info is not None and done.info.max_ongoing_requests == 7
    assert actions == [PublishReplicas()]  # callers learn the new slot count
    _, actions = replica_transition(done, Tick(), wanted, now=4.0)
    assert actions == []
    # A replica of older code is replaced, not reconfigured.
    _, actions = replica_transition(running(version="v0"), Tick(), wanted, now=1.0)
    assert not any(isinstance(a, ReconfigureReplica) for a in actions)


def test_a_failed_reconfigure_replaces_the_replica_and_says_why() -> None:
    state = DeploymentState(spec(user_config=1), {"r1": running(reconfiguring=True)})
    actions = apply_event(state, "r1", ReconfigureFailed("ValueError: no"), now=1.0)
    assert state.message == "reconfigure() failed: ValueError: no"
    assert not state.replicas["r1"].serving
    assert StopReplica("r1", "h-r1", graceful=True, drain_timeout_s=DRAIN_S) in actions
    assert Replace("reconfigure_failed") in actions


# ------------------------------------------------------------------------- a deployment


def test_plan_starts_replicas_up_to_the_target_and_stops_extras_starting_ones_first() -> None:
    state = DeploymentState(spec())
    actions = plan(state, now=0.0, new_id=ids())
    assert actions == [StartReplica("n1", state.spec, 0, 2), StartReplica("n2", state.spec, 1, 2)]
    assert plan(state, now=1.0, new_id=ids()) == []  # starting ones count
    state.replicas["r1"] = running("r1")
    state.spec = spec(num_replicas=1)
    plan(state, now=2.0, new_id=ids())
    assert [r.replica_id for r in state.replicas.values() if not r.stop_requested] == ["r1"]


def test_a_new_version_replaces_the_old_only_once_it_runs() -> None:
    state = DeploymentState(spec("v2"), {"o1": running("o1", "v0"), "o2": running("o2", "v0")})
    actions = plan(state, now=0.0, new_id=ids())
    assert [type(a) for a in actions] == [StartReplica, StartReplica]
    assert all(r.serving for r in state.replicas.values() if r.version == "v0")
    for new_id in ("n1", "n2"):
        apply_event(state, new_id, Started(info(new_id), new_id, state.spec.config), now=1.0)
    actions = plan(state, now=2.0, new_id=ids())
    stops = [a for a in actions if isinstance(a, StopReplica)]
    assert {a.replica_id for a in stops} == {"o1", "o2"}
    assert [i.replica_id for i in replica_table(state).replicas] == ["n1", "n2"]


def test_a_version_that_keeps_failing_stops_retrying_and_keeps_the_old_serving() -> None:
    state = DeploymentState(spec("v2", num_replicas=1), {"o1": running("o1", "v0")})
    new_ids = ids()
    for attempt in range(MAX_START_FAILURES):
        (start,) = [a for a in plan(state, now=float(attempt), new_id=new_ids) if isinstance(a, StartReplica)]
        actions = apply_event(state, start.replica_id, StartFailed("ValueError: broken"), now=float(attempt))
    assert state.failed and state.message == "Replica failed to start: ValueError: broken"
    assert PublishGone() not in actions  # the old version still serves
    assert not any(isinstance(a, StartReplica) for a in plan(state, now=5.0, new_id=new_ids))
    assert [i.replica_id for i in replica_table(state).replicas] == ["o1"]


def test_a_new_deployment_that_never_starts_fails_its_waiting_callers() -> None:
    state = DeploymentState(spec(num_replicas=1))
    # Callers queue for the first replica within the configured bound.
    assert replica_table(state).max_queued_requests == state.spec.config.max_queued_requests
    new_ids = ids()
    actions: list[Any] = []
    for attempt in range(MAX_START_FAILURES):
        (start,) = plan(state, now=float(attempt), new_id=new_ids)
        assert isinstance(start, StartReplica)
        actions = apply_event(state, start.replica_id, StartFailed("boom"), now=float(attempt))
    assert PublishGone() in actions


def test_a_deleted_deployment_stops_every_replica() -> None:
    state = DeploymentState(spec(), {"r1": running("r1"), "s1": Replica("s1", "v1")})
    state.deleting = True
    actions = plan(state, now=0.0, new_id=ids())
    assert StopReplica("r1", "h-r1", graceful=True, drain_timeout_s=DRAIN_S) in actions
    assert state.replicas["s1"].stop_requested  # stopped as soon as its start ends
    apply_event(state, "r1", Stopped(), now=1.0)
    apply_event(state, "s1", Started(info("s1"), "h", state.spec.config), now=1.0)
    apply_event(state, "s1", Stopped(), now=2.0)
    assert state.replicas == {}


def test_replicas_slow_to_start_are_logged_once() -> None:
    state = DeploymentState(spec(num_replicas=1), {"s1": Replica("s1", "v1", launched_at=0.0)})
    assert not any(isinstance(a, Log) for a in plan(state, now=29.0, new_id=ids()))
    logs = [a for a in plan(state, now=31.0, new_id=ids()) if isinstance(a, Log)]
    assert len(logs) == 1 and "starting for more than 30 s" in logs[0].message
    assert not any(isinstance(a, Log) for a in plan(state, now=60.0, new_id=ids()))


def test_replicas_turning_slow_together_make_one_line() -> None:
    slow = {f"s{n}": Replica(f"s{n}", "v1", launched_at=0.0) for n in range(6)}
    state = DeploymentState(spec(num_replicas=6), slow)
    logs = [a for a in plan(state, now=31.0, new_id=ids()) if isinstance(a, Log)]
    assert len(logs) == 1 and logs[0].message.startswith("a/D: 6 replica(s) starting for more than 30 s")


def test_the_deployments_continuation_wait_replaces_its_methods_own_in_the_table() -> None:
    declared = (StreamContinuation("write", 3, 100, 60.0), StreamContinuation("read", 2, 10, 5.0))
    state = DeploymentState(dataclasses.replace(spec(), continuations=declared))
    assert replica_table(state).continuations == declared
    state.spec = dataclasses.replace(spec(continuation_wait_s=300.0), continuations=declared)
    waits = [(rule.method, rule.limit, rule.wait_s) for rule in replica_table(state).continuations]
    assert waits == [("write", 3, 300.0), ("read", 2, 300.0)]
