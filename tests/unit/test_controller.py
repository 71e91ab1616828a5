"""The controller's reconcile logic against a fake backend (no Ray, no sockets)."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from app_toolkit import metrics
from app_toolkit._runtime.controller import checkpoint, publishing
from app_toolkit._runtime.controller import cluster as cluster_module
from app_toolkit._runtime.controller import controller as controller_module
from app_toolkit._runtime.controller.backend import ClusterView, Seat, Unplaced
from app_toolkit._runtime.controller.capacity import Capacity
from app_toolkit._runtime.controller.controller import ControllerCore
from app_toolkit._runtime.controller.deployment_state import MAX_START_FAILURES
from app_toolkit._runtime.controller.planning import plan
from app_toolkit._runtime.controller.proxy_states import ProxyStates
from app_toolkit._runtime.messages import AppSpec, DeploymentID, DeploymentSpec, ReplicaInfo
from app_toolkit._runtime.tables import (
    APPLICATIONS_KEY,
    ApplicationTable,
    DeploymentGone,
    ReplicaTable,
    replicas_key,
)
from app_toolkit.config import DeploymentConfig
from app_toolkit.exceptions import ConfigError, DeployError, ReplicaUnavailableError
from app_toolkit.metrics import HistogramValue
from app_toolkit.status import ApplicationStatus, DeploymentStatus, ProxyStatus, ReplicaState
from tests.waiting import wait_for_async

pytestmark = pytest.mark.anyio


class FakeBackend:
    def __init__(self) -> None:
        self.running: dict[str, str] = {}  # replica id -> code version
        self.started = 0
        self.fail_versions: set[str] = set()
        self.unhealthy: set[str] = set()
        self.checkpoints: list[bytes] = []
        self.on_checkpoint: Callable[[], None] = lambda: None
        self.reconfigured: list[tuple[Any, Any]] = []
        self.failing: set[str] = set()
        self.leftovers: list[Any] = []  # replicas "still running" for a restarted controller
        self.failed_checks = 0
        self.stored_tables: list[dict[str, Any]] = []
        #: Replicas the "cluster" has room for (None: any number); starts beyond it wait.
        self.room: int | None = None
        self.waiting: set[str] = set()  # replica ids waiting for room
        self.draining: dict[str, float] = {}
        self.released: list[str] = []
        self.node = "node-1"  # where replicas are placed
        self.ranks: dict[str, tuple[int, int, int, int]] = {}  # replica id -> rank, node, local, world
        self.hurried: list[Any] = []
        self.hold_starts = False  # starts wait until cancelled (a model that loads for long)
        self.cancelled_starts: list[str] = []
        self.deployment_of: dict[str, str] = {}  # replica id -> its deployment's name
        self.stop_gates: dict[str, asyncio.Event] = {}  # deployment name -> its stops wait for it
        self.route_waits: list[tuple[str, int]] = []  # the tables the proxies were awaited with
        self.lagging: list[str] = []  # the nodes whose proxies do not catch up

    async def start_replica(
        self, replica_id: str, spec: DeploymentSpec, seat: Seat
    ) -> tuple[ReplicaInfo, Any]:
        await asyncio.sleep(0)
        if self.hold_starts:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled_starts.append(replica_id)
                raise
        self.started += 1
        self.waiting.add(replica_id)
        try:
            while self.room is not None and len(self.running) >= self.room:
                await asyncio.sleep(0.001)
        finally:
            self.waiting.discard(replica_id)
        node = self.node
        rank = seat.place(node)
        self.ranks[replica_id] = (rank.rank, rank.node_rank, rank.local_rank, seat.world_size)
        if spec.code_version in self.fail_versions:
            raise DeployError(f"ValueError: version {spec.code_version} is broken")
        self.running[replica_id] = spec.code_version
        self.deployment_of[replica_id] = spec.id.name
        max_ongoing = spec.config.max_ongoing_requests
        info = ReplicaInfo(replica_id, spec.id, "127.0.0.1", 1, b"t", max_ongoing, node, rank=seat.rank)
        return info, replica_id

    async def stop_replica(
        self, handle: Any, graceful: bool, hurry: bool = False, grace_s: float | None = None
    ) -> None:
        if hurry:
            self.hurried.append(handle)
        gate = self.stop_gates.get(self.deployment_of.get(handle, ""))
        if gate is not None:
            await gate.wait()  # a replica whose stop takes long (its drain, its stop hooks)
        self.running.pop(handle, None)

    async def cluster_view(self) -> ClusterView:
        full = {replica_id: Unplaced("needs {'accel': 1.0}: none free") for replica_id in self.waiting}
        unplaced = full if self.room is not None else {}
        return ClusterView(dict(self.draining), unplaced, frozenset(self.waiting))

    async def release_node(self, node_id: str) -> None:
        self.released.append(node_id)

    async def check_health(self, handle: Any, timeout_s: float) -> None:
        if handle in self.unhealthy:
            raise ReplicaUnavailableError("gone")
        if handle in self.failing:
            self.failed_checks += 1
            raise RuntimeError("check_health() says no")

    async def reconfigure_replica(self, handle: Any, config: DeploymentConfig) -> None:
        self.reconfigured.append((handle, config.user_config))

    async def find_replicas(self) -> list[Any]:
        return list(self.leftovers)

    def load_object(self, data: bytes) -> object:
        return pickle.loads(data)  # the tests serialize with pickle.dumps

    async def save_checkpoint(self, data: bytes) -> None:
        self.on_checkpoint()
        self.checkpoints.append(data)

    async def load_checkpoint(self) -> bytes | None:
        return self.checkpoints[-1] if self.checkpoints else None

    async def save_tables(self, tables: dict[str, Any]) -> None:
        self.stored_tables.append(tables)

    async def proxies_lagging(self, key: str, version: int, timeout_s: float) -> list[str]:
        self.route_waits.append((key, version))
        return self.lagging

    async def stop_proxies(self) -> None:
        return None  # there are none


def app(
    name: str = "a", version: str = "v1", replicas: int = 2, prefix: str | None = "/a", **options: Any
) -> AppSpec:
    options.setdefault("health_check_period_s", 0.01)
    config = DeploymentConfig(num_replicas=replicas, **options)
    spec = DeploymentSpec(DeploymentID(name, "D"), b"def", b"args", config, True, version)
    return AppSpec(name, prefix, "D", (spec,))


async def reconcile_rounds(core: ControllerCore, rounds: int) -> None:
    """Run reconcile steps and let what they start run, without waiting on the clock."""
    for _ in range(rounds):
        core._reconcile()
        for _ in range(3):
            await asyncio.sleep(0)


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    await wait_for_async(condition, timeout_s)


def _replicas(core: ControllerCore, key: str) -> ReplicaTable:
    table = core.longpoll.get(key)
    assert isinstance(table, ReplicaTable), table
    return table


async def started(backend: FakeBackend) -> ControllerCore:
    core = ControllerCore(backend)
    await core.start()
    return core


async def test_apply_config_makes_the_apps_exactly_the_files_and_remembers_it() -> None:
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([app("by-hand", prefix="/x")])
    file = {"applications": [{"name": "a"}, {"name": "b"}]}
    with pytest.raises(ConfigError, match="already used"):  # checked before anything changes
        await core.apply_config([app("a", prefix="/p"), app("b", prefix="/p")], file)
    assert list(core.apps) == ["by-hand"] and core.applied_file is None
    await core.apply_config([app("a", prefix="/a"), app("b", prefix="/b")], file)
    assert sorted(core.apps) == ["a", "b"]  # the app deployed by hand is gone
    saved = checkpoint.loads(backend.checkpoints[-1])
    assert saved is not None and (saved.apps, saved.applied_file, saved.capacity) == (
        core.apps,
        file,
        Capacity(),
    )
    assert saved.policy == ({}, {}) and set(saved.lifecycles) == {
        DeploymentID("a", "D"),
        DeploymentID("b", "D"),
    }
    # Changed by hand, an app no longer runs what the file says; deleting the others
    # leaves no file at all.
    await core.deploy_apps([app("a", version="v2", prefix="/a")])
    assert core.applied_file == {"applications": [{"name": "b"}]}
    await core.delete_app("b")
    assert core.applied_file is None


async def test_deploys_and_deletes_return_once_the_proxies_hold_their_routes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = FakeBackend()
    core = await started(backend)

    def published() -> tuple[str, int]:
        return (APPLICATIONS_KEY, core.longpoll.version(APPLICATIONS_KEY))

    await core.deploy_apps([app("a", prefix="/a")])
    assert backend.route_waits[-1] == published()
    await core.apply_config([app("a", prefix="/a"), app("b", prefix="/b")], {"applications": []})
    assert backend.route_waits[-1] == published() and len(backend.route_waits) == 2
    backend.lagging = ["node-2"]
    await core.delete_app("b")
    assert backend.route_waits[-1] == published() and len(backend.route_waits) == 3
    assert any("The proxies of node-2 do not have the new routes" in r.getMessage() for r in caplog.records)
    await core.delete_app("a", hurry=True)  # a shutdown: the proxies stop anyway
    assert len(backend.route_waits) == 3
    await core.stop()


async def test_deploy_checkpoints_before_acknowledging_then_reaches_running() -> None:
    backend = FakeBackend()
    core = await started(backend)
    seen_apps: list[list[str]] = []
    backend.on_checkpoint = lambda: seen_apps.append(list(core.apps))
    await core.deploy_apps([app()])
    saved = checkpoint.loads(backend.checkpoints[-1])
    assert seen_apps == [["a"]] and saved is not None and "a" in saved.apps
    await until(lambda: core.snapshot().applications["a"].status is ApplicationStatus.RUNNING)
    table = core.longpoll.get(replicas_key(DeploymentID("a", "D")))
    assert isinstance(table, ReplicaTable)
    assert len(table.replicas) == 2 and table.max_queued_requests == 1000
    routes = core.longpoll.get(APPLICATIONS_KEY)
    assert isinstance(routes, ApplicationTable) and [r.route_prefix for r in routes.applications] == ["/a"]
    await core.stop()


async def test_callers_queue_for_a_new_deployment_within_its_bound_from_the_first_table() -> None:
    backend = FakeBackend()
    core = await started(backend)
    gate = asyncio.Event()
    original = backend.start_replica

    async def slow_start(replica_id: str, spec: DeploymentSpec, seat: Seat) -> tuple[ReplicaInfo, Any]:
        await gate.wait()
        return await original(replica_id, spec, seat)

    backend.start_replica = slow_start  # type: ignore[method-assign]
    await core.deploy_apps([app(replicas=1, max_queued_requests=0)])
    key = replicas_key(DeploymentID("a", "D"))
    # Starting: callers wait for the first replica, within the configured bound.
    assert core.longpoll.get(key) == ReplicaTable((), 0)
    gate.set()
    await until(lambda: len(_replicas(core, key).replicas) == 1)
    assert _replicas(core, key).max_queued_requests == 0
    await core.stop()


async def test_failing_starts_are_retried_then_deploy_failed_with_the_message() -> None:
    backend = FakeBackend()
    backend.fail_versions.add("bad")
    core = await started(backend)
    await core.deploy_apps([app(version="bad")])
    await until(lambda: core.snapshot().applications["a"].status is ApplicationStatus.DEPLOY_FAILED)
    deployment = core.snapshot().applications["a"].deployments["D"]
    assert "version bad is broken" in deployment.message
    # Callers waiting for a first replica are told, rather than left waiting.
    assert core.longpoll.get(replicas_key(DeploymentID("a", "D"))) == DeploymentGone()
    attempts = backend.started
    # Starts run two at a time (2 replicas), so one more may already be under way when
    # the last allowed failure lands; after that, nothing more is tried.
    assert MAX_START_FAILURES <= attempts <= MAX_START_FAILURES + 1
    await reconcile_rounds(core, 20)
    assert backend.started == attempts
    # The failure is one of the recent events status() shows.
    errors = [e for e in core.snapshot().events if e.level == "ERROR"]
    assert len(errors) == 1 and "a/D failed to deploy" in errors[0].message
    await core.stop()


async def test_new_version_replaces_old_only_once_it_runs() -> None:
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([app(version="v1")])
    await until(lambda: sorted(backend.running.values()) == ["v1", "v1"])
    await core.deploy_apps([app(version="v2")])
    await until(lambda: sorted(backend.running.values()) == ["v2", "v2"])
    assert core.snapshot().applications["a"].deployments["D"].status is DeploymentStatus.HEALTHY
    await core.stop()


async def test_failed_rollout_keeps_the_old_replicas_serving() -> None:
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([app(version="v1")])
    await until(lambda: len(backend.running) == 2)
    backend.fail_versions.add("v2")
    await core.deploy_apps([app(version="v2")])
    await until(lambda: core.snapshot().applications["a"].status is ApplicationStatus.DEPLOY_FAILED)
    assert sorted(backend.running.values()) == ["v1", "v1"]
    assert len(_replicas(core, replicas_key(DeploymentID("a", "D"))).replicas) == 2
    await core.stop()


#: A replica holds one of the fake backend's slots (``room``), and an upgrade waits 50 ms for room.
FILLS_A_SLOT: dict[str, Any] = {"surge_timeout_s": 0.05, "ray_actor_options": {"resources": {"accel": 1}}}


@pytest.fixture
def quick_cluster_view(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller asks the (fake) cluster every 10 ms instead of every second."""
    monkeypatch.setattr(cluster_module, "PERIOD_S", 0.01)


@pytest.mark.usefixtures("quick_cluster_view")
async def test_an_upgrade_in_a_full_cluster_goes_in_steps_and_finishes() -> None:
    backend = FakeBackend()
    backend.room = 2  # two replicas fit: no room for a surge
    core = await started(backend)
    await core.deploy_apps([app(version="v1", **FILLS_A_SLOT)])
    await until(lambda: sorted(backend.running.values()) == ["v1", "v1"])
    await core.deploy_apps([app(version="v2", **FILLS_A_SLOT)])
    seen: set[str] = set()

    def upgraded() -> bool:
        upgrade = core.snapshot().applications["a"].deployments["D"].upgrade
        if upgrade is not None:
            seen.add(upgrade.mode)
        return sorted(backend.running.values()) == ["v2", "v2"] and upgrade is None

    await until(upgraded)
    assert "surge" in seen
    assert any("replacing old replicas in steps" in event.message for event in core.events)
    assert core.snapshot().applications["a"].status is ApplicationStatus.RUNNING
    await core.stop()


def _running(core: ControllerCore) -> list[str]:
    """The versions of app a's running replicas, as the controller's status has them."""
    replicas = core.snapshot().applications["a"].deployments["D"].replicas
    return sorted(r.code_version for r in replicas if r.state is ReplicaState.RUNNING)


@pytest.mark.usefixtures("quick_cluster_view")
async def test_a_failed_upgrade_in_a_full_cluster_brings_the_old_version_back() -> None:
    backend = FakeBackend()
    backend.room = 2
    core = await started(backend)
    await core.deploy_apps([app(version="v1", **FILLS_A_SLOT)])
    # Running as the controller sees them (what a failed upgrade falls back on), not only
    # as the backend runs them: under load the controller sees them a while after.
    await until(lambda: _running(core) == ["v1", "v1"])
    backend.fail_versions.add("v2")
    await core.deploy_apps([app(version="v2", **FILLS_A_SLOT)])
    await until(lambda: core.snapshot().applications["a"].status is ApplicationStatus.DEPLOY_FAILED)
    await until(lambda: sorted(backend.running.values()) == ["v1", "v1"])
    # The replica table is published once the controller has seen the second one ready:
    # a moment after the backend runs it.
    key = replicas_key(DeploymentID("a", "D"))
    await until(lambda: len(_replicas(core, key).replicas) == 2)
    await core.stop()


@pytest.mark.usefixtures("quick_cluster_view")
async def test_replicas_leave_a_draining_node_and_the_node_is_released() -> None:
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([app(replicas=2)])
    await until(lambda: len(backend.running) == 2)
    before = set(backend.running)
    backend.node = "node-2"  # where successors go
    backend.draining = {"node-1": 60.0}
    await until(lambda: backend.released == ["node-1"])
    assert not before & set(backend.running) and len(backend.running) == 2
    assert core.snapshot().draining_nodes == ["node-1"]
    # Placed while the replicas they replace still held node rank 0 (ranks stay for life).
    assert {rank[1] for replica, rank in backend.ranks.items() if replica not in before} == {1}
    await core.stop()


async def test_target_capacity_scales_a_config_files_deployments() -> None:
    backend = FakeBackend()
    core = await started(backend)
    file: dict[str, Any] = {"target_capacity": 50, "applications": [{"name": "a"}]}
    await core.apply_config([app(replicas=4)], file)
    await until(lambda: len(backend.running) == 2)
    assert core.snapshot().target_capacity == 50
    await core.apply_config([app(replicas=4)], {**file, "target_capacity": 100})
    await until(lambda: len(backend.running) == 4)
    await core.deploy_apps([app(replicas=4)])  # by hand: no longer the file's, at full capacity
    assert core.snapshot().target_capacity == 100
    await core.stop()


async def test_a_reload_hurries_the_streams_of_the_replicas_it_replaces() -> None:
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([app(version="v1")])
    await until(lambda: len(backend.running) == 2)
    old = set(backend.running)
    reload = app(version="v2")
    reload = dataclasses.replace(
        reload, deployments=tuple(dataclasses.replace(d, reloaded=True) for d in reload.deployments)
    )
    await core.deploy_apps([reload])
    await until(lambda: sorted(backend.running.values()) == ["v2", "v2"])
    assert set(backend.hurried) == old
    await core.stop()


async def test_dead_replica_is_replaced_and_scaling_follows_num_replicas() -> None:
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([app(replicas=2)])
    await until(lambda: len(backend.running) == 2)
    key = replicas_key(DeploymentID("a", "D"))
    ranks = {info.replica_id: info.rank for info in _replicas(core, key).replicas}
    assert sorted(ranks.values()) == [0, 1]
    victim = sorted(backend.running)[0]
    replaced = _replacements("gone")
    backend.unhealthy.add(victim)
    await until(lambda: victim not in backend.running and len(_replicas(core, key).replicas) == 2)
    assert _replacements("gone") == replaced + 1
    assert any(victim in e.message and "replacing it" in e.message for e in core.snapshot().events)
    # The replacement takes the rank of the replica it replaces (shard keys follow ranks).
    now = {info.replica_id: info.rank for info in _replicas(core, key).replicas}
    (newcomer,) = set(now) - set(ranks)
    assert now[newcomer] == ranks[victim]
    await core.deploy_apps([app(replicas=3)])  # same version: scale out, no restart
    await until(lambda: len(backend.running) == 3)
    assert backend.started == 4
    await until(lambda: sorted(info.rank for info in _replicas(core, key).replicas) == [0, 1, 2])
    await core.stop()


def _replacements(reason: str) -> float:
    found = metrics.value("app_toolkit_replica_replacements_total", application="a", reason=reason)
    assert not isinstance(found, HistogramValue)
    return found or 0.0


async def test_delete_stops_replicas_and_closes_tables() -> None:
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([app()])
    await until(lambda: len(backend.running) == 2)
    await core.delete_app("a")
    assert core.longpoll.get(APPLICATIONS_KEY) == ApplicationTable(())
    assert core.longpoll.get(replicas_key(DeploymentID("a", "D"))) == DeploymentGone()
    await until(lambda: not backend.running and "a" not in core.apps and not core.deployments)
    await core.stop()


def _callee_and_caller() -> tuple[DeploymentSpec, DeploymentSpec]:
    """Application "a": D (its ingress) binds Callee, so Callee is listed first."""
    config = DeploymentConfig(num_replicas=1, health_check_period_s=0.01)
    callee = DeploymentSpec(DeploymentID("a", "Callee"), b"def", b"args", config, False, "v1")
    caller = DeploymentSpec(DeploymentID("a", "D"), b"def", b"args", config, True, "v1")
    return callee, caller


async def test_a_deployment_is_deleted_once_the_replicas_that_may_call_it_are_gone() -> None:
    backend = FakeBackend()
    core = await started(backend)
    callee, caller = _callee_and_caller()
    await core.deploy_apps([AppSpec("a", "/a", "D", (callee, caller))])  # D binds Callee
    await until(lambda: len(backend.running) == 2)
    stopping = backend.stop_gates["D"] = asyncio.Event()
    # A new version without Callee: D's old replica may call it until it is gone.
    await core.deploy_apps([AppSpec("a", "/a", "D", (dataclasses.replace(caller, code_version="v2"),))])
    await reconcile_rounds(core, 5)
    assert len(_replicas(core, replicas_key(callee.id)).replicas) == 1
    stopping.set()
    await until(lambda: core.longpoll.get(replicas_key(callee.id)) == DeploymentGone())
    await until(lambda: set(backend.running.values()) == {"v2"})
    # Deleting the application: D goes first, then Callee.
    await core.deploy_apps([AppSpec("a", "/a", "D", (callee, caller))])
    await until(lambda: len(backend.running) == 2 and set(backend.running.values()) == {"v1"})
    stopping.clear()
    await core.delete_app("a")
    await reconcile_rounds(core, 5)
    assert core.longpoll.get(replicas_key(caller.id)) == DeploymentGone()
    assert len(_replicas(core, replicas_key(callee.id)).replicas) == 1
    stopping.set()
    gone = DeploymentGone()
    await until(lambda: core.longpoll.get(replicas_key(callee.id)) == gone and not backend.running)
    await core.stop()


async def test_a_hurried_delete_takes_a_dropped_deployment_that_waits_for_its_callers() -> None:
    backend = FakeBackend()
    core = await started(backend)
    callee, caller = _callee_and_caller()
    await core.deploy_apps([AppSpec("a", "/a", "D", (callee, caller))])  # D binds Callee
    await until(lambda: len(backend.running) == 2)
    stopping = backend.stop_gates["D"] = asyncio.Event()
    await core.deploy_apps([AppSpec("a", "/a", "D", (dataclasses.replace(caller, code_version="v2"),))])
    await reconcile_rounds(core, 5)
    assert len(_replicas(core, replicas_key(callee.id)).replicas) == 1  # it waits for D's v1
    await core.delete_app("a", hurry=True)  # a shutdown: it waits no more
    assert core.longpoll.get(replicas_key(callee.id)) == DeploymentGone()
    stopping.set()
    await until(lambda: not backend.running)
    await core.stop()


async def test_shutdown_hurries_the_drains_of_every_replica() -> None:
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([app(replicas=2)])
    await until(lambda: len(backend.running) == 2)
    running = set(backend.running)
    async with asyncio.timeout(5):
        await core.shutdown()
    assert set(backend.hurried) == running  # their streams end as their drains start


async def test_shutdown_cancels_replica_starts_instead_of_waiting_for_them() -> None:
    # A replica still in its constructor (a model loading) serves nothing and has nothing
    # to drain: shutdown does not wait for its start, which may take minutes; it cancels
    # it, and the backend stops the process it was starting.
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([app(replicas=1)])
    await until(lambda: len(backend.running) == 1)
    backend.hold_starts = True
    await core.deploy_apps([app(version="v2", replicas=1)])  # v2's start hangs; v1 keeps serving
    await until(lambda: len(core.deployments[DeploymentID("a", "D")].replicas) == 2)
    # Well below the shutdown's drain bound (_SHUTDOWN_DRAIN_S): it did not wait for it.
    async with asyncio.timeout(5):
        await core.shutdown()
    assert backend.running == {} and len(backend.cancelled_starts) == 1


async def test_route_prefix_conflicts_and_restart_from_checkpoint() -> None:
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([app("a", prefix="/x")])
    with pytest.raises(ConfigError, match="already used by application 'a'"):
        await core.deploy_apps([app("b", prefix="/x")])
    await core.stop()
    restarted = await started(backend)  # a new controller reads the checkpoint
    assert list(restarted.apps) == ["a"]
    await restarted.stop()


async def test_the_loop_survives_a_failing_step() -> None:
    backend = FakeBackend()
    core = await started(backend)
    original = core._reconcile
    calls = 0

    def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise RuntimeError("bug in a step")
        original()

    core._reconcile = flaky  # type: ignore[method-assign]
    await core.deploy_apps([app()])
    await until(lambda: len(backend.running) == 2)
    await core.stop()


async def test_autoscaled_deployment_follows_reported_load_and_expires_silent_callers() -> None:

    backend = FakeBackend()
    core = await started(backend)
    scaling = {
        "min_replicas": 0,
        "max_replicas": 4,
        "target_ongoing_requests": 1,
        "upscale_delay_s": 0,
        "downscale_delay_s": 0,
        "look_back_period_s": 0.05,
    }
    config = DeploymentConfig(autoscaling_config=scaling, health_check_period_s=0.01)
    spec = DeploymentSpec(DeploymentID("s", "D"), b"def", b"args", config, True, "v1")
    await core.deploy_apps([AppSpec("s", "/s", "D", (spec,))])
    await reconcile_rounds(core, 5)
    assert backend.running == {} and core.snapshot().applications["s"].status is ApplicationStatus.RUNNING
    await core.record_load("proxy-1", {spec.id: 1.0})  # a request waits: scale from zero
    await until(lambda: len(backend.running) == 1)
    await core.record_load("proxy-1", {spec.id: 3.0})
    await until(lambda: len(backend.running) == 3)
    info = core.snapshot().applications["s"].deployments["D"]
    assert info.target_replicas == 3 and info.autoscaling is not None
    assert info.autoscaling.last_decision_to == 3
    await core.record_load("proxy-1", {})
    await until(lambda: not backend.running)
    # A caller that reports load and then goes silent stops counting after the TTL.
    core.loads.ttl_s = 0.3
    await core.record_load("handle-2", {spec.id: 2.0})
    await until(lambda: len(backend.running) == 2)
    await until(lambda: not backend.running)
    await core.stop()


async def test_a_failing_health_check_replaces_the_replica_after_the_threshold() -> None:
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([app(replicas=1, health_check_failure_threshold=4)])
    await until(lambda: len(backend.running) == 1)
    sick = next(iter(backend.running))
    backend.failing.add(sick)
    await until(lambda: sick not in backend.running)
    assert backend.failed_checks == 4  # replaced after exactly the threshold, not before
    await until(lambda: len(backend.running) == 1)
    await core.stop()


async def test_a_restarted_controller_adopts_running_replicas_instead_of_replacing_them() -> None:
    from app_toolkit._runtime.messages import AdoptedReplica

    backend = FakeBackend()
    first = await started(backend)
    await first.deploy_apps([app(replicas=2)])
    state = first.deployments[DeploymentID("a", "D")]
    # Both running, and both started as far as the controller knows (their info recorded).
    await until(
        lambda: (
            len(backend.running) == 2
            and len(state.replicas) == 2
            and all(r.info is not None for r in state.replicas.values())
        )
    )
    await first.stop()  # the controller "dies"; its replicas keep running
    backend.leftovers = [
        AdoptedReplica(r.info, r.version, r.config, r.handle)  # type: ignore[arg-type]
        for r in state.replicas.values()
    ]
    stray = ReplicaInfo("gone.D.1", DeploymentID("gone", "D"), "127.0.0.1", 1, b"t", 1)
    backend.running["gone.D.1"] = "v0"
    backend.leftovers.append(AdoptedReplica(stray, "v0", DeploymentConfig(), "gone.D.1"))
    started_before = backend.started

    second = await started(backend)  # reloads the checkpoint, adopts what runs
    table = _replicas(second, replicas_key(DeploymentID("a", "D")))
    assert {info.replica_id for info in table.replicas} == {r.replica_id for r in state.replicas.values()}
    await reconcile_rounds(core=second, rounds=5)
    assert backend.started == started_before  # nothing restarted
    assert set(backend.running) == set(state.replicas)  # the stray replica was stopped
    assert second.snapshot().applications["a"].status is ApplicationStatus.RUNNING
    await second.stop()


async def _restart(backend: FakeBackend, first: ControllerCore) -> ControllerCore:
    """Stop ``first`` as a dying controller (its replicas keep running) and start another
    on the same backend: it reloads the checkpoint and adopts what runs."""
    from app_toolkit._runtime.messages import AdoptedReplica

    await first.stop()
    backend.leftovers = [
        AdoptedReplica(r.info, r.version, r.config, r.handle)  # type: ignore[arg-type]
        for state in first.deployments.values()
        for r in state.replicas.values()
        if r.serving
    ]
    return await started(backend)


@pytest.mark.usefixtures("quick_cluster_view")
async def test_a_restarted_controller_keeps_a_failed_upgrade_failed_and_the_old_version_whole() -> None:
    backend = FakeBackend()
    backend.room = 2
    first = await started(backend)
    await first.deploy_apps([app(version="v1", **FILLS_A_SLOT)])
    await until(lambda: _running(first) == ["v1", "v1"])  # what the failed upgrade falls back on
    backend.fail_versions.add("v2")
    await first.deploy_apps([app(version="v2", **FILLS_A_SLOT)])
    await until(lambda: first.snapshot().applications["a"].status is ApplicationStatus.DEPLOY_FAILED)
    await until(lambda: _running(first) == ["v1", "v1"] and sorted(backend.running.values()) == ["v1", "v1"])
    await reconcile_rounds(first, 3)  # the checkpoint of the failure is written
    attempts = backend.started
    second = await _restart(backend, first)
    await reconcile_rounds(second, 10)
    assert backend.started == attempts  # v2 is not tried again
    assert sorted(backend.running.values()) == ["v1", "v1"]
    assert second.snapshot().applications["a"].status is ApplicationStatus.DEPLOY_FAILED
    await second.stop()


async def test_a_restarted_controller_keeps_the_files_target_capacity() -> None:
    backend = FakeBackend()
    first = await started(backend)
    await first.apply_config([app(replicas=4)], {"target_capacity": 50, "applications": [{"name": "a"}]})
    # Running as the controller sees them (what the next one adopts), not only as the
    # backend runs them: under load the controller sees them a while after.
    await until(lambda: len(_running(first)) == 2)
    second = await _restart(backend, first)
    await reconcile_rounds(second, 10)
    assert len(backend.running) == 2 and second.snapshot().target_capacity == 50
    await second.stop()


async def test_published_tables_are_stored_when_they_change_and_not_more_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([app()])
    await until(lambda: core.snapshot().applications["a"].status is ApplicationStatus.RUNNING)
    # The loop stores what callers would need if the controller were gone now.
    await until(lambda: bool(backend.stored_tables) and backend.stored_tables[-1] == core.longpoll.snapshot())
    stored = backend.stored_tables[-1]
    assert len(_replicas(core, replicas_key(DeploymentID("a", "D"))).replicas) == 2
    assert stored[APPLICATIONS_KEY] == core.longpoll.get(APPLICATIONS_KEY)
    count = len(backend.stored_tables)
    for _ in range(3):
        await core.tables.store(backend)  # nothing changed: nothing stored
    assert len(backend.stored_tables) == count
    monkeypatch.setattr(publishing, "TABLES_STORE_PERIOD_S", 3600.0)
    core.longpoll.publish(replicas_key(DeploymentID("a", "gone")), DeploymentGone())
    await core.tables.store(backend)  # changed, but stored too recently
    assert len(backend.stored_tables) == count
    monkeypatch.setattr(publishing, "TABLES_STORE_PERIOD_S", 0.0)
    await core.tables.store(backend)
    assert backend.stored_tables[-1][replicas_key(DeploymentID("a", "gone"))] == DeploymentGone()
    await core.stop()


async def test_a_pass_plans_only_the_deployments_with_something_due(monkeypatch: pytest.MonkeyPatch) -> None:
    planned: list[DeploymentID] = []
    real_plan = plan  # what controller_module.plan is: it imports it from planning

    def counting(state: Any, now: float, new_id: Callable[[], str], draining: Any) -> Any:
        planned.append(state.spec.id)
        return real_plan(state, now, new_id, draining)

    monkeypatch.setattr(controller_module, "plan", counting)
    backend = FakeBackend()
    core = await started(backend)
    await core.deploy_apps([app("idle", replicas=2, health_check_period_s=3600.0)])
    await core.deploy_apps([app("busy", prefix="/busy", replicas=1)])  # checked every 10 ms
    await until(lambda: len(backend.running) == 3)
    await reconcile_rounds(core, 3)
    planned.clear()
    await asyncio.sleep(0.5)  # the loop's passes, 0.1 s apart; busy's checks every 10 ms
    assert DeploymentID("idle", "D") not in planned  # nothing due for an hour
    assert DeploymentID("busy", "D") in planned
    # A deploy plans its deployment on the next pass.
    await core.deploy_apps([app("idle", replicas=3, health_check_period_s=3600.0)])
    await until(lambda: sum(r.startswith("idle") for r in backend.running) == 3)
    await core.stop()


async def test_status_says_each_proxys_ray_serve_status_as_the_backend_records_it() -> None:
    # Ray Serve's ProxyStatus: STARTING until a proxy first answers, HEALTHY, UNHEALTHY
    # when it did not answer, DRAINING while its node leaves (it serves on); gone once
    # stopped (Ray Serve's DRAINED is a moment it never shows).
    proxies = ProxyStates()
    core = ControllerCore(FakeBackend(), proxies)
    await core.start()
    proxies.starting("head")
    proxies.starting("worker")
    assert core.snapshot().proxies == {"head": ProxyStatus.STARTING, "worker": ProxyStatus.STARTING}
    assert core.snapshot().proxy_urls == {}
    proxies.serving("head", "http://10.0.0.1:8000")
    proxies.not_serving("worker")
    status = core.snapshot()
    assert (status.proxies, status.proxy_urls) == (
        {"head": ProxyStatus.HEALTHY, "worker": ProxyStatus.UNHEALTHY},
        {"head": "http://10.0.0.1:8000"},
    )
    proxies.serving("worker", "http://10.0.0.2:8000")
    proxies.leaving("worker")
    status = core.snapshot()
    assert status.proxies == {"head": ProxyStatus.HEALTHY, "worker": ProxyStatus.DRAINING}
    assert status.proxy_urls["worker"] == "http://10.0.0.2:8000"  # it still serves
    proxies.removed("worker")
    assert core.snapshot().proxies == {"head": ProxyStatus.HEALTHY}
    assert [s.value for s in ProxyStatus] == ["STARTING", "HEALTHY", "UNHEALTHY", "DRAINING", "DRAINED"]
    await core.stop()
