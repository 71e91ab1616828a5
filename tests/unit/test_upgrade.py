"""Upgrades (pure): the default surge, its steps when the cluster has no room, Ray Serve's
rolling_update_percentage and max_surge_percent, a failed version rolled back, replicas
leaving a node, ranks, and target_capacity. A small simulated cluster with a fixed number
of slots plays the backend: a start takes a free slot or waits for one, a stop frees its
slot when the replica has drained."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest

from app_toolkit._runtime.controller import upgrade
from app_toolkit._runtime.controller.capacity import Capacity, next_capacity
from app_toolkit._runtime.controller.deployment_state import (
    MAX_START_FAILURES,
    DeploymentState,
    Leaving,
    StartReplica,
    apply_event,
    new_spec,
    place,
    set_capacity,
)
from app_toolkit._runtime.controller.planning import LEAVE_MARGIN_S, SUCCESSOR_WAIT_S, plan
from app_toolkit._runtime.controller.replica_state import (
    CancelStart,
    Placement,
    Started,
    StartFailed,
    Stopped,
    StopReplica,
)
from app_toolkit._runtime.controller.status_view import deployment_status
from app_toolkit._runtime.messages import DeploymentID, DeploymentSpec, ReplicaInfo
from app_toolkit.config import AutoscalingConfig, DeploymentConfig
from app_toolkit.status import DeploymentStatus, ReplicaState

D = DeploymentID("a", "D")
FULL = "needs {'accel': 1.0}: none free"


def spec(version: str, **options: Any) -> DeploymentSpec:
    """Replicas that each hold an accelerator (what the simulated slots stand for)."""
    defaults = {
        "num_replicas": 2,
        "health_check_period_s": 3600.0,
        "ray_actor_options": {"resources": {"accel": 1}},
    }
    config = DeploymentConfig(**{**defaults, **options})
    return DeploymentSpec(D, b"def", b"args", config, True, version)


@dataclass
class Cluster:
    """``slots`` replicas fit; a start waits for a free slot (reported as unplaced), a
    graceful stop drains for ``drain_s`` before its slot is free. Starts of versions in
    ``broken`` fail once placed."""

    state: DeploymentState
    slots: int
    drain_s: float = 2.0
    broken: set[str] = field(default_factory=set)
    costs: dict[str, int] = field(default_factory=dict)  # version -> slots a replica takes (1)
    #: How long a replica given its slot is still reported waiting for one (Ray's demand
    #: reports lag, and its process takes a while to start).
    report_lag_s: float = 0.0
    booting: dict[str, tuple[StartReplica, float]] = field(default_factory=dict)  # -> when placed
    now: float = 0.0
    waiting: list[StartReplica] = field(default_factory=list)
    draining: dict[str, float] = field(default_factory=dict)  # replica id -> when its slot frees
    holding: dict[str, int] = field(default_factory=dict)  # replica id -> slots it holds
    lowest_serving: int = 99  # the fewest replicas serving at any step (after the first)
    max_holding: int = 0
    _ids: Any = field(default_factory=lambda: (f"r{n}" for n in itertools.count()))

    def step(self, seconds: float = 1.0) -> None:
        self.now += seconds
        for replica_id, free_at in list(self.draining.items()):
            if free_at <= self.now:
                del self.draining[replica_id]
                self.holding.pop(replica_id, None)
                apply_event(self.state, replica_id, Stopped(), self.now)
        self._perform(plan(self.state, self.now, lambda: next(self._ids)))
        self._place_waiting()
        self.max_holding = max(self.max_holding, sum(self.holding.values()))

    def run(self, seconds: float, until: Any = None) -> None:
        for _ in range(int(seconds)):
            self.step()
            serving = sum(1 for r in self.state.replicas.values() if r.serving)
            self.lowest_serving = min(self.lowest_serving, serving)
            if until is not None and until():
                return

    def _perform(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, StartReplica):
                self.waiting.append(action)
            elif isinstance(action, CancelStart):
                self.waiting = [w for w in self.waiting if w.replica_id != action.replica_id]
                self.holding.pop(action.replica_id, None)
                apply_event(self.state, action.replica_id, Stopped(), self.now)
            elif isinstance(action, StopReplica):
                self.draining[action.replica_id] = self.now + (self.drain_s if action.graceful else 0)

    def _place_waiting(self) -> None:
        for replica_id, (start, ready_at) in list(self.booting.items()):
            if self.now >= ready_at:
                del self.booting[replica_id]
                self._boot(start)
            elif self.state.replicas.get(start.replica_id) is not None:
                # The cluster's report lags: it still says the replica waits for room.
                apply_event(self.state, start.replica_id, Placement(FULL), self.now)
        for start in list(self.waiting):
            cost = self.costs.get(start.spec.code_version, 1)
            if sum(self.holding.values()) + cost <= self.slots:
                self.waiting.remove(start)
                self.holding[start.replica_id] = cost
                if self.report_lag_s:
                    self.booting[start.replica_id] = (start, self.now + self.report_lag_s)
                    apply_event(self.state, start.replica_id, Placement(FULL), self.now)
                else:
                    self._boot(start)
            else:
                apply_event(self.state, start.replica_id, Placement(FULL), self.now)

    def _boot(self, start: StartReplica) -> None:
        """A replica given its slot: placed (its node known), then started or failed."""
        if start.replica_id not in self.state.replicas:
            self.holding.pop(start.replica_id, None)  # stopped meanwhile
            return
        place(self.state, start.replica_id, "node-1")
        if start.spec.code_version in self.broken:
            self.holding.pop(start.replica_id)
            self._perform(apply_event(self.state, start.replica_id, StartFailed("boom"), self.now))
            return
        info = ReplicaInfo(start.replica_id, D, "127.0.0.1", 1, b"t", 100, "node-1", rank=start.rank)
        started = Started(info, start.replica_id, start.spec.config)
        self._perform(apply_event(self.state, start.replica_id, started, self.now))

    def versions(self, serving: bool = True) -> list[str]:
        return sorted(r.version for r in self.state.replicas.values() if r.serving or not serving)


def steady(version: str = "v1", slots: int = 2, **options: Any) -> Cluster:
    cluster = Cluster(DeploymentState(spec(version, **options)), slots)
    cluster.run(5)
    assert cluster.versions() == [version] * cluster.state.target
    return cluster


def deploy(cluster: Cluster, version: str, **options: Any) -> None:
    new_spec(cluster.state, spec(version, **options), cluster.now)


def done(cluster: Cluster, version: str) -> Any:
    return lambda: cluster.versions(serving=False) == [version, version] and cluster.state.upgrade is None


# -------------------------------------------------------------------------- the default


def test_with_room_the_new_version_surges_and_serving_never_dips() -> None:
    cluster = steady(slots=4)
    deploy(cluster, "v2")
    cluster.run(30, until=done(cluster, "v2"))
    assert done(cluster, "v2")()
    assert cluster.lowest_serving >= 2  # an old replica stops only once a new one runs
    assert cluster.state.upgrade is None


def test_without_room_the_surge_waits_then_goes_in_steps_and_finishes() -> None:
    cluster = steady(slots=2, surge_timeout_s=10.0)
    deploy(cluster, "v2", surge_timeout_s=10.0)
    cluster.run(9)
    # Waiting for room: nothing old stopped yet, status says what it waits for.
    assert cluster.versions() == ["v1", "v1"]
    info = deployment_status(cluster.state, 0.0, cluster.now).upgrade
    assert info is not None and info.mode == "surge" and info.waiting_for == f"2 replicas {FULL}"
    cluster.run(60, until=done(cluster, "v2"))
    assert done(cluster, "v2")()
    assert cluster.lowest_serving == 1  # one step (20 % of 2, at least one replica) at a time
    assert cluster.max_holding <= 2


def test_a_late_report_that_a_successor_was_placed_never_makes_a_second_step_early() -> None:
    cluster = steady(slots=2, surge_timeout_s=5.0)
    cluster.report_lag_s = 3.0  # a successor given its room still looks unplaced for 3 s
    deploy(cluster, "v2", surge_timeout_s=5.0)
    cluster.run(60, until=done(cluster, "v2"))
    assert done(cluster, "v2")()
    assert cluster.lowest_serving == 1  # one step at a time, never both old replicas at once


def test_the_steps_show_in_status_with_the_step_and_the_wait() -> None:
    cluster = steady(slots=2, surge_timeout_s=5.0)
    deploy(cluster, "v2", surge_timeout_s=5.0)
    cluster.run(7)  # past the wait: the first step has stopped an old replica
    info = deployment_status(cluster.state, 0.0, cluster.now).upgrade
    assert info is not None
    assert (info.mode, info.step, info.steps, info.step_size) == ("steps", 1, 2, 1)
    assert info.old_replicas == 1 and info.target_replicas == 2
    assert deployment_status(cluster.state, 0.0, cluster.now).status is DeploymentStatus.UPDATING


def test_room_that_appears_lets_the_surge_finish_without_more_steps() -> None:
    cluster = steady(slots=2, surge_timeout_s=5.0)
    deploy(cluster, "v2", surge_timeout_s=5.0)
    cluster.run(3)
    cluster.slots = 4  # a node joined before the wait ran out
    cluster.run(30, until=done(cluster, "v2"))
    assert done(cluster, "v2")() and cluster.lowest_serving == 2


def test_successors_larger_than_the_room_one_step_frees_get_more_steps_and_finish() -> None:
    cluster = steady(slots=2, surge_timeout_s=2.0)
    cluster.costs["v2"] = 2  # a new replica needs what two old ones hold
    deploy(cluster, "v2", num_replicas=1, surge_timeout_s=2.0)
    cluster.run(60, until=lambda: cluster.versions(serving=False) == ["v2"])
    assert cluster.versions(serving=False) == ["v2"] and cluster.max_holding <= 2


def test_a_rollback_restores_the_old_versions_own_count() -> None:
    cluster = steady(slots=8, num_replicas=4)
    cluster.broken.add("v2")
    deploy(cluster, "v2", num_replicas=1)
    cluster.run(60, until=lambda: cluster.state.failed and cluster.versions() == ["v1"] * 4)
    assert cluster.state.failed and cluster.versions() == ["v1"] * 4
    cluster.run(10)
    assert cluster.state.upgrade is None  # the rollback is done; the failure stays in status


def test_old_replicas_that_hold_nothing_the_new_ones_wait_for_are_never_stepped_away() -> None:
    cluster = steady(slots=2, surge_timeout_s=1.0, ray_actor_options={"resources": {"other": 1}})
    deploy(cluster, "v2", surge_timeout_s=1.0)  # waits for "accel", which v1 does not hold
    cluster.run(20)
    assert cluster.versions() == ["v1", "v1"]


def test_a_replica_no_node_could_hold_never_makes_the_upgrade_step() -> None:
    cluster = steady(slots=2, surge_timeout_s=1.0)
    deploy(cluster, "v2", surge_timeout_s=1.0)
    for _ in range(10):  # the cluster says no node could ever hold the new replicas
        cluster.now += 1
        for replica in list(cluster.state.replicas.values()):
            if replica.version == "v2":
                apply_event(
                    cluster.state, replica.replica_id, Placement("needs {'accel': 9.0}", True), cluster.now
                )
        plan(cluster.state, cluster.now, lambda: "x")
    assert cluster.versions() == ["v1", "v1"]  # stopping old replicas would not help


def test_a_version_that_fails_to_start_brings_the_old_one_back_to_its_full_count() -> None:
    cluster = steady(slots=2, surge_timeout_s=2.0)
    cluster.broken.add("v2")
    deploy(cluster, "v2", surge_timeout_s=2.0)
    cluster.run(60, until=lambda: cluster.state.failed and cluster.versions() == ["v1", "v1"])
    assert cluster.state.failed and cluster.versions() == ["v1", "v1"]
    status = deployment_status(cluster.state, 0.0, cluster.now)
    assert status.status is DeploymentStatus.DEPLOY_FAILED
    assert "brought back to the full count" in status.message
    assert status.upgrade is not None and status.upgrade.mode == "rollback"
    cluster.run(10)
    assert cluster.versions(serving=False) == ["v1", "v1"]  # it stays so
    assert cluster.state.start_failures == MAX_START_FAILURES


def test_a_new_deploy_after_a_failed_one_upgrades_from_the_version_that_serves() -> None:
    cluster = steady(slots=4)
    cluster.broken.add("v2")
    deploy(cluster, "v2")
    cluster.run(30, until=lambda: cluster.state.failed)
    deploy(cluster, "v3")
    cluster.run(30, until=done(cluster, "v3"))
    assert done(cluster, "v3")() and not cluster.state.failed


# ------------------------------------------------------------------------ Ray Serve's options


def test_rolling_update_percentage_replaces_a_step_at_a_time_without_a_surge() -> None:
    cluster = steady(slots=4, num_replicas=4)
    deploy(cluster, "v2", num_replicas=4, rolling_update_percentage=0.5)
    cluster.step()
    stopping = [r for r in cluster.state.replicas.values() if r.stop_requested]
    assert len(stopping) == 2  # int(0.5 * 4): stop two, start their two successors
    cluster.run(60, until=lambda: sorted(cluster.versions(serving=False)) == ["v2"] * 4)
    assert cluster.versions(serving=False) == ["v2"] * 4
    assert cluster.lowest_serving == 2


def test_max_surge_percent_starts_that_many_beside_the_old_ones() -> None:
    cluster = steady(slots=8, num_replicas=4)
    deploy(cluster, "v2", num_replicas=4, max_surge_percent=25)
    cluster.step()
    new = [r for r in cluster.state.replicas.values() if r.version == "v2"]
    assert len(new) == 1  # 25 % of 4
    cluster.run(60, until=lambda: cluster.versions(serving=False) == ["v2"] * 4)
    assert cluster.versions(serving=False) == ["v2"] * 4 and cluster.lowest_serving >= 4


@pytest.mark.parametrize(
    ("fraction", "target", "size"), [(0.2, 2, 1), (0.2, 10, 2), (0.29, 100, 28), (1.0, 3, 3), (0.01, 5, 1)]
)
def test_steps_are_rounded_as_ray_serve_rounds_them(fraction: float, target: int, size: int) -> None:
    assert upgrade.step_size(fraction, target) == size


def test_surges_are_rounded_up() -> None:
    assert [upgrade.surge_size(p, t) for p, t in ((28, 25), (25, 4), (1, 2), (0, 10), (100, 3))] == [
        7,
        1,
        1,
        0,
        3,
    ]


# ------------------------------------------------------------------------ leaving nodes


def test_a_replica_on_a_leaving_node_serves_until_its_successor_runs_then_drains() -> None:
    cluster = steady(slots=4)
    leaving = next(iter(cluster.state.replicas))
    successors = iter(["s1", "s2"])
    leaving_node = {"node-1": Leaving(since=cluster.now, deadline=1000.0)}
    actions = plan(cluster.state, cluster.now, lambda: next(successors), leaving_node)
    # Both replicas are on node-1 in this simulation: each gets a successor elsewhere.
    starts = [a for a in actions if isinstance(a, StartReplica)]
    assert len(starts) == 2 and cluster.state.replicas[leaving].serving
    for start in starts:
        info = ReplicaInfo(start.replica_id, D, "h", 1, b"t", 100, "node-2", rank=start.rank)
        apply_event(cluster.state, start.replica_id, Started(info, start.replica_id, start.spec.config), 1.0)
    actions = plan(cluster.state, cluster.now + 1, lambda: "x", leaving_node)
    on_leaving_node = [r.replica_id for r in cluster.state.replicas.values() if r.node_id == "node-1"]
    assert len(on_leaving_node) == 2
    assert sorted(a.replica_id for a in actions if isinstance(a, StopReplica)) == sorted(on_leaving_node)


def test_a_replica_on_a_leaving_node_drains_soon_without_a_successor_and_before_the_deadline() -> None:
    cluster = steady(slots=2)  # no room for successors
    began = cluster.now
    # A deadline far away: it waits SUCCESSOR_WAIT_S for a successor, then drains anyway.
    far = {"node-1": Leaving(since=began, deadline=began + 1000.0)}
    assert not [a for a in plan(cluster.state, began, lambda: "s1", far) if isinstance(a, StopReplica)]
    late = plan(cluster.state, began + SUCCESSOR_WAIT_S, lambda: "s2", far)
    assert len([a for a in late if isinstance(a, StopReplica)]) == 2
    # A deadline near: it drains a grace period and a margin before it, even sooner.
    cluster = steady(slots=2)
    began = cluster.now
    grace = 20.0
    near = {"node-1": Leaving(since=began, deadline=began + grace + LEAVE_MARGIN_S + 1.0)}
    assert not [a for a in plan(cluster.state, began, lambda: "s1", near) if isinstance(a, StopReplica)]
    soon = plan(cluster.state, began + 1.0, lambda: "s2", near)
    assert len([a for a in soon if isinstance(a, StopReplica)]) == 2
    # A deadline nearer than its grace period: it drains at once, its grace period cut to
    # what is left (less the margin for its lifespan shutdown and the node's proxy).
    cluster = steady(slots=2)
    began = cluster.now
    nearer = {"node-1": Leaving(since=began, deadline=began + grace / 2 + LEAVE_MARGIN_S)}
    stops = [a for a in plan(cluster.state, began, lambda: "s3", nearer) if isinstance(a, StopReplica)]
    assert [stop.grace_s for stop in stops] == [grace / 2, grace / 2]


# -------------------------------------------------------------------------------- ranks


def test_ranks_node_ranks_and_local_ranks_are_the_lowest_free_of_the_version() -> None:
    state = DeploymentState(spec("v1", num_replicas=4))
    starts = [a for a in plan(state, 0.0, iter(["a", "b", "c", "d"]).__next__) if isinstance(a, StartReplica)]
    assert [(s.rank, s.world_size) for s in starts] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    ranks = [
        place(state, s.replica_id, node) for s, node in zip(starts, ["n1", "n2", "n1", "n2"], strict=True)
    ]
    assert [(r.rank, r.node_rank, r.local_rank) for r in ranks] == [
        (0, 0, 0),
        (1, 1, 0),
        (2, 0, 1),
        (3, 1, 1),
    ]


# ------------------------------------------------------------------------ target capacity


@pytest.mark.parametrize(
    ("count", "percent", "scaled"),
    [(3, 50, 2), (5, 50, 3), (10, 25, 3), (7, 15, 1), (1, 0, 0), (0, 50, 0), (4, 100, 4), (4, None, 4)],
)
def test_target_capacity_scales_as_ray_serve_rounds(count: int, percent: float | None, scaled: int) -> None:
    assert Capacity(percent).scale(count) == scaled


def test_target_capacity_direction_and_autoscaling_bounds() -> None:
    first = next_capacity(None, [], 50, ["a"])
    assert first.rising  # a first file rises
    assert not next_capacity(first, ["a"], 25, ["a"]).rising
    assert next_capacity(Capacity(25), ["a"], 50, ["a"]).rising
    assert next_capacity(first, ["a"], None, ["a"]) == Capacity()
    config = AutoscalingConfig(min_replicas=2, initial_replicas=4, max_replicas=10)
    assert Capacity(50, rising=True).bounds(config) == (2, 5)  # initial_replicas while rising
    assert Capacity(50, rising=False).bounds(config) == (1, 5)


def test_a_deployment_at_half_capacity_runs_half_its_replicas() -> None:
    cluster = steady(slots=8, num_replicas=4)
    set_capacity(cluster.state, Capacity(50))
    cluster.run(10)
    assert len(cluster.versions()) == 2
    set_capacity(cluster.state, Capacity(100))
    cluster.run(10)
    assert len(cluster.versions()) == 4
    assert all(r.state is ReplicaState.RUNNING for r in cluster.state.replicas.values())
