"""What the controller knows of each deployment, and how it changes: pure transitions.

``apply_event(state, replica_id, event, now)`` moves one replica through its life
(``replica_state.py``) and keeps the deployment's own record (start failures, message,
whether any replica ever ran) in step; ``plan(state, now, new_id, draining)`` says what
the deployment needs now: replicas to start or stop (an upgrade's steps:
``upgrade.py``; replicas on nodes that are leaving: moved), health checks and
reconfigures due. Both return actions for the controller to perform; neither does I/O or
reads a clock.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from app_toolkit._runtime.controller import upgrade
from app_toolkit._runtime.controller.autoscaling import Autoscaler
from app_toolkit._runtime.controller.capacity import Capacity
from app_toolkit._runtime.controller.replica_state import (
    SLOW_START_S,
    Event,
    Log,
    ReconfigureFailed,
    Replica,
    ReplicaAction,
    Started,
    StartFailed,
    Stop,
    Tick,
    replica_transition,
)
from app_toolkit._runtime.messages import AdoptedReplica, DeploymentSpec
from app_toolkit._runtime.request_context import ReplicaRank
from app_toolkit._runtime.tables import ReplicaTable
from app_toolkit.status import ReplicaState

#: Failed starts of one version after which its deployment is DEPLOY_FAILED.
MAX_START_FAILURES = 3

#: Node id -> when it leaves (controller clock; ``inf``: no deadline).
Draining = Mapping[str, float]


@dataclass(frozen=True, slots=True)
class StartReplica:
    """Start the (already recorded) replica ``replica_id`` from ``spec``: ``rank`` among
    its version's replicas, of ``world_size``."""

    replica_id: str
    spec: DeploymentSpec
    rank: int = -1
    world_size: int = 0


@dataclass(frozen=True, slots=True)
class PublishGone:
    """The deployment cannot serve (deleted, or failed before any replica ran): callers
    waiting for it must fail rather than wait."""


Action = ReplicaAction | StartReplica | PublishGone


@dataclass
class Upgrade:
    """An upgrade under way: since when, how many old replicas it stopped, and whether the
    default surge found no room and goes in steps."""

    since: float
    replaced: int = 0
    steps: bool = False


@dataclass
class DeploymentState:
    """What the controller knows of one deployment: its spec, replicas and target.

    Changed only by the functions of this module (and ``spec`` by a new deploy).
    """

    spec: DeploymentSpec
    replicas: dict[str, Replica] = field(default_factory=dict)
    start_failures: int = 0
    message: str = ""
    failed: bool = False
    deleting: bool = False
    ever_ran: bool = False  # a replica of this deployment has been RUNNING
    autoscaler: Autoscaler | None = None
    #: The version that served before this one: what a failed upgrade goes back to.
    previous: DeploymentSpec | None = None
    upgrade: Upgrade | None = None
    #: The config file's target_capacity (controller/capacity.py).
    capacity: Capacity = field(default_factory=Capacity)

    @property
    def target(self) -> int:
        """Replicas wanted now: the autoscaler's target, else num_replicas (either at the
        target capacity)."""
        if self.autoscaler is not None:
            return self.autoscaler.target
        return self.capacity.scale(self.spec.config.num_replicas)

    @property
    def serving_spec(self) -> DeploymentSpec:
        """The version replicas should run: the spec, or after it failed to start, the
        version that served before it."""
        if self.failed and self.previous is not None:
            return self.previous
        return self.spec

    @property
    def world_size(self) -> int:
        """What a replica starting now is told its world size is: the replicas the
        deployment is set to run (num_replicas, Ray Serve's; an autoscaled deployment's
        target)."""
        config = self.spec.config
        return self.target if config.autoscaling_config is not None else config.num_replicas


# ------------------------------------------------------------------------------ events


def apply_event(state: DeploymentState, replica_id: str, event: Event, now: float) -> list[Action]:
    """Apply ``event`` to one replica of ``state``; returns what to do about it."""
    replica = state.replicas.get(replica_id)
    if replica is None:
        return []  # already gone (e.g. a late outcome of a replaced replica)
    spec = state.spec
    after, replica_actions = replica_transition(replica, event, spec, now)
    if after is None:
        del state.replicas[replica_id]
    else:
        state.replicas[replica_id] = after
    actions: list[Action] = list(replica_actions)
    if isinstance(event, Started) and after is not None and after.state is ReplicaState.RUNNING:
        state.ever_ran = True
        if after.version == spec.code_version:
            state.message = ""
    elif isinstance(event, StartFailed) and replica.version == spec.code_version and not state.failed:
        state.start_failures += 1
        state.message = f"Replica failed to start: {event.error}"
        if state.start_failures >= MAX_START_FAILURES and not state.failed:
            state.failed = True
            actions.append(Log(logging.ERROR, f"{spec.id} failed to deploy: {event.error}"))
            if state.previous is not None:
                state.message += (
                    f"; the upgrade stopped and version {state.previous.code_version} is brought "
                    "back to the full count"
                )
                actions.append(Log(logging.WARNING, f"{spec.id}: {state.message}"))
            elif not any(r.state is ReplicaState.RUNNING for r in state.replicas.values()):
                actions.append(PublishGone())
    elif isinstance(event, ReconfigureFailed):
        state.message = f"reconfigure() failed: {event.error}"
    return actions


def place(state: DeploymentState, replica_id: str, node_id: str) -> ReplicaRank:
    """A starting replica was placed on ``node_id``: its full rank. Its node's rank is the
    one its version's replicas there already have, else the lowest free one; its local
    rank the lowest free among them on that node."""
    replica = state.replicas.get(replica_id)
    if replica is None:
        return ReplicaRank(-1, -1, -1)  # stopped meanwhile: the start is being abandoned
    peers = [
        r
        for r in state.replicas.values()
        if r.version == replica.version and not r.stop_requested and r.node_rank >= 0 and r is not replica
    ]
    node_ranks = {r.node_id: r.node_rank for r in peers}
    node_rank = node_ranks.get(node_id)
    if node_rank is None:
        node_rank = _lowest_free(set(node_ranks.values()))
    local_rank = _lowest_free({r.local_rank for r in peers if r.node_id == node_id})
    state.replicas[replica_id] = dataclasses.replace(
        replica, node_id=node_id, node_rank=node_rank, local_rank=local_rank
    )
    return ReplicaRank(replica.rank, node_rank, local_rank)


def _lowest_free(taken: set[int]) -> int:
    return next(rank for rank in itertools.count() if rank not in taken)


# -------------------------------------------------------------------------------- plan


def plan(
    state: DeploymentState, now: float, new_id: Callable[[], str], draining: Draining | None = None
) -> list[Action]:
    """What the deployment needs now: retire it if deleted; else start or stop replicas
    toward the target (replacing an older version as ``upgrade.py`` says, moving replicas
    off ``draining`` nodes), start due health checks and reconfigures, and explain
    replicas slow to start."""
    if state.deleting:
        return _each(state, Stop(), now)
    draining = draining or {}
    actions = _move_off(state, now, draining)
    actions += _scale(state, now, new_id, draining)
    actions += _each(state, Tick(), now)
    newly_slow = [replica for replica in slow_starters(state, now) if not replica.slow_start_logged]
    for replica in newly_slow:
        state.replicas[replica.replica_id] = dataclasses.replace(replica, slow_start_logged=True)
    if newly_slow:  # one line for them all: the message counts every slow replica
        actions.append(Log(logging.WARNING, f"{state.spec.id}: {slow_start_message(state, now)}"))
    return actions


def next_due(state: DeploymentState, draining: Draining | None = None) -> float:
    """When ``plan`` next has something to do if no event, deploy or new target comes
    first: the earliest health check due, a start turning slow, an upgrade's wait for room
    running out, or a leaving node's deadline for its replicas. Until then a plan would
    return nothing (the controller skips it: ``-inf`` means plan every pass)."""
    if state.deleting:
        return -math.inf
    due = math.inf
    for replica in state.replicas.values():
        if replica.state is ReplicaState.RUNNING and not replica.checking:
            due = min(due, replica.next_health_check)
            if draining and replica.node_id in draining and not replica.stop_requested:
                due = min(due, _leave_by(replica, draining))
        elif replica.state is ReplicaState.STARTING and not (
            replica.stop_requested or replica.slow_start_logged
        ):
            due = min(due, replica.launched_at + SLOW_START_S)
    if state.upgrade is not None and not state.upgrade.steps:
        due = min(due, upgrade.room_due(census(state, draining or {}), _options(state)))
    return due


def _each(state: DeploymentState, event: Event, now: float) -> list[Action]:
    actions: list[Action] = []
    for replica_id in list(state.replicas):
        actions += apply_event(state, replica_id, event, now)
    return actions


def census(state: DeploymentState, draining: Draining) -> upgrade.Census:
    """The replicas as an upgrade counts them: the serving version's are new, the others
    old. A running replica of the serving version on a leaving node counts as neither
    (``_move_off`` stops it once its successor runs); old ones there go first."""
    version = state.serving_spec.code_version
    new_starting: list[Replica] = []
    new_running: list[Replica] = []
    old_starting: list[Replica] = []
    old_running: list[Replica] = []
    leaving: list[Replica] = []
    old_stopping = 0
    for replica in state.replicas.values():
        if replica.stop_requested:
            old_stopping += replica.version != version
        elif replica.state is ReplicaState.STARTING:
            (new_starting if replica.version == version else old_starting).append(replica)
        elif replica.node_id in draining:
            if replica.version != version:
                leaving.append(replica)
        else:
            (new_running if replica.version == version else old_running).append(replica)
    return upgrade.Census(
        state.target,
        tuple(new_starting),
        tuple(new_running),
        tuple(old_starting),
        tuple(leaving + old_running),
        old_stopping,
    )


def _options(state: DeploymentState) -> upgrade.Options:
    """What the upgrade follows: the deployment's options, or after a failed version,
    the default policy (the version that served before comes back as fast as room allows)."""
    config = state.spec.config
    if state.serving_spec is not state.spec:
        return upgrade.Options(surge_timeout_s=config.surge_timeout_s)
    return upgrade.Options(config.rolling_update_percentage, config.max_surge_percent, config.surge_timeout_s)


def _scale(state: DeploymentState, now: float, new_id: Callable[[], str], draining: Draining) -> list[Action]:
    spec = state.serving_spec
    counted = census(state, draining)
    moves = upgrade.moves(counted, _options(state), now)
    actions: list[Action] = []
    if state.failed and spec is state.spec:
        moves = dataclasses.replace(moves, start=0)  # nothing to fall back on: keep what runs
    if moves.start:
        taken = {r.rank for r in counted.new_starting + counted.new_running}
        free_ranks = (rank for rank in itertools.count() if rank not in taken)
        world_size = state.world_size
        for _, rank in zip(range(moves.start), free_ranks, strict=False):
            replica_id = new_id()
            state.replicas[replica_id] = Replica(replica_id, spec.code_version, launched_at=now, rank=rank)
            actions.append(StartReplica(replica_id, spec, rank, world_size))
    old = 0
    for replica in moves.stop:
        outdated = replica.version != spec.code_version
        old += outdated
        actions += apply_event(state, replica.replica_id, Stop(hurry=outdated and state.spec.reloaded), now)
    actions += _follow_upgrade(state, counted, moves, old)
    return actions


def _follow_upgrade(
    state: DeploymentState, counted: upgrade.Census, moves: upgrade.Moves, stopped_old: int
) -> list[Action]:
    """Keep the record of an upgrade under way (for status), and end it once no older
    replica is left."""
    record = state.upgrade
    if record is None:
        return []
    record.replaced += stopped_old
    actions: list[Action] = []
    if moves.steps and not record.steps:
        actions.append(
            Log(
                logging.WARNING,
                f"{state.spec.id}: no room for the new version beside the old one "
                f"({upgrade.waiting_for(counted)}); replacing old replicas in steps",
            )
        )
    record.steps = moves.steps
    if counted.old_active + counted.old_stopping == 0 and not state.failed:
        state.upgrade = None
        state.previous = None  # the version it replaced is gone
        actions.append(Log(logging.INFO, f"{state.spec.id}: upgrade to {state.spec.code_version} finished"))
    return actions


def _move_off(state: DeploymentState, now: float, draining: Draining) -> list[Action]:
    """Replicas of the serving version on leaving nodes keep serving until successors run
    elsewhere (the census does not count them, so they get successors), then drain; any
    replica there drains anyway once its node's deadline is a grace period away."""
    if not draining:
        return []
    version = state.serving_spec.code_version
    leaving = [
        r
        for r in state.replicas.values()
        if r.node_id in draining and r.state is ReplicaState.RUNNING and not r.stop_requested
    ]
    if not leaving:
        return []
    running_elsewhere = sum(
        1 for r in state.replicas.values() if r.version == version and r.serving and r.node_id not in draining
    )
    ours = sorted((r for r in leaving if r.version == version), key=lambda r: _leave_by(r, draining))
    excess = running_elsewhere + len(ours) - state.target
    going = ours[: max(excess, 0)]
    going += [r for r in leaving if r not in going and now >= _leave_by(r, draining)]
    actions: list[Action] = []
    for replica in going:
        where = f"{replica.replica_id} off node {replica.node_id[:12]}"
        actions.append(Log(logging.INFO, f"{state.spec.id}: draining {where}"))
        actions += apply_event(state, replica.replica_id, Stop(), now)
    return actions


def _leave_by(replica: Replica, draining: Draining) -> float:
    """When a replica on a leaving node must start draining to finish before the node goes."""
    grace = replica.config.graceful_shutdown_timeout_s if replica.config is not None else 20.0
    return draining[replica.node_id] - grace


# ------------------------------------------------------------------------ other changes


def new_spec(state: DeploymentState, spec: DeploymentSpec, now: float = 0.0) -> None:
    """A deploy changed the deployment's desired state."""
    if state.spec.code_version != spec.code_version:
        state.previous = _fallback(state)
        state.start_failures, state.failed, state.message = 0, False, ""
        older = [r for r in state.replicas.values() if r.version != spec.code_version]
        state.upgrade = Upgrade(since=now) if any(not r.stop_requested for r in older) else None
    state.spec = spec
    follow_autoscaling(state)


def _fallback(state: DeploymentState) -> DeploymentSpec | None:
    """Of the current spec and the one it replaced, the one with the most replicas
    running (what a failed upgrade goes back to); None if neither runs."""
    running: dict[str, int] = {}
    for replica in state.replicas.values():
        if replica.serving:
            running[replica.version] = running.get(replica.version, 0) + 1
    candidates = [
        spec for spec in (state.spec, state.previous) if spec is not None and running.get(spec.code_version)
    ]
    return max(candidates, key=lambda spec: running[spec.code_version], default=None)


def set_capacity(state: DeploymentState, capacity: Capacity) -> None:
    """A config file set (or a deploy by hand cleared) the target capacity."""
    state.capacity = capacity
    if state.autoscaler is not None:
        config = state.spec.config.autoscaling_config
        state.autoscaler.bound(capacity.bounds(config) if config is not None else None)


def hold_models(state: DeploymentState, replica_id: str, models: tuple[str, ...]) -> bool:
    """A replica reported the multiplexed models it holds; True if its table entry changed."""
    replica = state.replicas.get(replica_id)
    if replica is None or replica.info is None or replica.info.models == models:
        return False
    state.replicas[replica_id] = dataclasses.replace(
        replica, info=dataclasses.replace(replica.info, models=models)
    )
    return True


def adopt(state: DeploymentState, found: AdoptedReplica, now: float) -> None:
    """Take over a replica that a previous controller left running."""
    state.replicas[found.info.replica_id] = Replica(
        found.info.replica_id,
        found.code_version,
        ReplicaState.RUNNING,
        found.info,
        found.handle,
        next_health_check=now + state.spec.config.health_check_period_s,
        config=found.config,
        rank=found.info.rank,
        node_rank=found.node_rank,
        local_rank=found.local_rank,
        node_id=found.info.node_id,
    )
    state.ever_ran = True


def replica_table(state: DeploymentState) -> ReplicaTable:
    """What callers get: the serving replicas and how much they may queue."""
    infos = sorted(
        (r.info for r in state.replicas.values() if r.serving and r.info is not None),
        key=lambda info: info.replica_id,
    )
    # Until a first replica runs (a new deployment starting up), callers queue without a
    # bound: a request that arrives before its proxy has the new table waits for the
    # replica instead of being refused.
    config = state.spec.config
    max_queued = config.max_queued_requests if state.ever_ran else -1
    overload = (config.backpressure_config.status_code, config.backpressure_config.retry_after_s)
    return ReplicaTable(tuple(infos), max_queued, config.affinity, overload=overload)


def autoscale(state: DeploymentState, load: float, now: float) -> list[Action]:
    """Feed the autoscaler one load sample and let it move the target."""
    scaler = state.autoscaler
    if scaler is None or state.deleting:
        return []
    scaler.record(now, load)
    before = scaler.target
    after = scaler.step(now, load)
    if after == before:
        return []
    message = (
        f"{state.spec.id}: {before} -> {after} replicas for an average load of {scaler.average_load():.1f}"
    )
    return [Log(logging.INFO, message)]


def follow_autoscaling(state: DeploymentState) -> None:
    """Start, keep, retune or drop the deployment's autoscaler for its (new) spec."""
    config = state.spec.config.autoscaling_config
    if config is None:
        state.autoscaler = None
    elif state.autoscaler is None:
        state.autoscaler = Autoscaler.start(config)
        keep_size(state)  # taking over a running deployment
    elif state.autoscaler.config != config:
        state.autoscaler = Autoscaler(config, state.autoscaler.target)
        state.autoscaler.hold(state.autoscaler.target)
    if state.autoscaler is not None and config is not None:
        state.autoscaler.bound(state.capacity.bounds(config) if state.capacity.percent is not None else None)


def keep_size(state: DeploymentState) -> None:
    """An autoscaled deployment that already has replicas keeps that many (within its
    bounds) instead of starting over from initial_replicas."""
    running = sum(1 for r in state.replicas.values() if not r.stop_requested)
    if state.autoscaler is not None and running:
        state.autoscaler.hold(running)


def slow_starters(state: DeploymentState, now: float) -> list[Replica]:
    """Replicas that have been starting for longer than ``SLOW_START_S``."""
    return [
        r
        for r in state.replicas.values()
        if r.state is ReplicaState.STARTING and not r.stop_requested and now - r.launched_at > SLOW_START_S
    ]


def slow_start_message(state: DeploymentState, now: float) -> str:
    """Why replicas are not running yet: what the cluster lacks for those it cannot place
    (as soon as it says so), else, for replicas slow to start, what each asks for."""
    unplaced = [
        r.unplaced
        for r in state.replicas.values()
        if r.state is ReplicaState.STARTING and not r.stop_requested and r.unplaced
    ]
    if unplaced:
        reasons = sorted(set(unplaced))
        return (
            f"{len(unplaced)} replica(s) cannot be placed yet: {'; '.join(reasons)}. "
            "Replicas already running keep serving."
        )
    slow = slow_starters(state, now)
    if not slow:
        return ""
    asks = state.spec.config.ray_actor_options.model_dump(exclude_defaults=True, exclude={"runtime_env"})
    needs = ", ".join(f"{key}={value}" for key, value in asks.items()) or "no reserved resources"
    return (
        f"{len(slow)} replica(s) starting for more than {SLOW_START_S:.0f} s: the cluster may "
        f"not have room for one (each needs {needs}), a runtime_env may be installing, or "
        "the constructor is slow. Replicas already running keep serving."
    )
