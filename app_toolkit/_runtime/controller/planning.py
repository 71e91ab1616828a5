"""What a deployment needs now: ``plan(state, now, new_id, draining)`` returns the
actions that move it toward its desired state — replicas started or stopped toward the
target (an upgrade's steps: ``upgrade.py``), replicas moved off nodes that are leaving,
health checks and reconfigures due — and ``next_due`` when it next has something to do.
Pure: no I/O, no clock of its own.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Callable

from app_toolkit._runtime.controller import upgrade
from app_toolkit._runtime.controller.deployment_state import (
    Action,
    DeploymentState,
    Draining,
    StartReplica,
    apply_event,
    slow_start_message,
    slow_starters,
)
from app_toolkit._runtime.controller.replica_state import SLOW_START_S, Event, Log, Replica, Stop, Tick
from app_toolkit.config import DeploymentConfig
from app_toolkit.status import ReplicaState

#: A replica on a leaving node drains at the latest this long plus its grace period before
#: the node's deadline: its lifespan shutdown, and the node's proxy finishing its requests.
LEAVE_MARGIN_S = 10.0
#: ... and at the latest this long after the node began leaving, successor or not: the
#: node then goes within its replicas' grace period and a few seconds.
SUCCESSOR_WAIT_S = 5.0


def plan(
    state: DeploymentState, now: float, new_id: Callable[[], str], draining: Draining | None = None
) -> list[Action]:
    """What the deployment needs now: retire it if deleted; else start or stop replicas
    toward the target (replacing an older version as ``upgrade.py`` says, moving replicas
    off ``draining`` nodes), start due health checks and reconfigures, and explain
    replicas slow to start."""
    if state.deleting:
        return _each(state, Stop(hurry=state.hurried), now)
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
    draining = draining or {}
    due = math.inf
    for replica in state.replicas.values():
        if replica.state is ReplicaState.RUNNING and not replica.checking:
            due = min(due, replica.next_health_check)
            if replica.node_id in draining and not replica.stop_requested:
                due = min(due, _leave_by(replica, state.spec.config, draining))
        elif replica.state is ReplicaState.STARTING and not (
            replica.stop_requested or replica.slow_start_logged
        ):
            due = min(due, replica.launched_at + SLOW_START_S)
    record = state.upgrade
    if record is not None:
        due = min(due, upgrade.room_due(census(state, draining), options(state), record.freed_at))
    return due


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


def options(state: DeploymentState) -> upgrade.Options:
    """What the upgrade follows: the deployment's options, or after a failed version,
    the default policy (the version that served before comes back as fast as room allows).
    Steps help only if the old replicas hold a resource the new ones ask for."""
    config = state.spec.config
    serving = state.serving_spec.config
    wanted = set(serving.reserved_resources()) | ({"per node"} if serving.max_replicas_per_node else set())
    held: set[str] = set()
    for replica in state.replicas.values():
        if replica.version != state.serving_spec.code_version and replica.config is not None:
            held |= set(replica.config.reserved_resources())
            held |= {"per node"} if replica.config.max_replicas_per_node else set()
    helps = bool(wanted & held)
    if state.serving_spec is not state.spec:
        return upgrade.Options(surge_timeout_s=config.surge_timeout_s, steps_help=helps)
    return upgrade.Options(
        config.rolling_update_percentage,
        config.max_surge_percent,
        config.surge_timeout_s,
        helps,
        failing=state.start_failures > 0,
    )


def _each(state: DeploymentState, event: Event, now: float) -> list[Action]:
    actions: list[Action] = []
    for replica_id in list(state.replicas):
        actions += apply_event(state, replica_id, event, now)
    return actions


def _scale(state: DeploymentState, now: float, new_id: Callable[[], str], draining: Draining) -> list[Action]:
    spec = state.serving_spec
    counted = census(state, draining)
    policy = options(state)
    record = state.upgrade
    if record is not None and record.stepped_at > record.freed_at and counted.old_stopping == 0:
        record.freed_at = now  # the last step's replicas are gone: their room is free
    moves = upgrade.moves(counted, policy, now, record.freed_at if record is not None else -math.inf)
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
    if record is not None:
        actions += _follow_upgrade(state, counted, moves, old, now, stepwise=policy.ray_serve or moves.steps)
    return actions


def _follow_upgrade(
    state: DeploymentState,
    counted: upgrade.Census,
    moves: upgrade.Moves,
    stopped_old: int,
    now: float,
    stepwise: bool,
) -> list[Action]:
    """Keep the record of an upgrade under way (for status), and end it once no older
    replica is left."""
    record = state.upgrade
    assert record is not None
    actions: list[Action] = []
    if stepwise and stopped_old:
        record.replaced += stopped_old
        record.stepped_at = now
    if moves.steps and not record.steps:
        actions.append(
            Log(
                logging.WARNING,
                f"{state.spec.id}: no room for the new version beside the old one "
                f"({upgrade.waiting_for(counted)}); replacing old replicas in steps",
            )
        )
        record.steps = True  # for the rest of the upgrade (status says how it went)
    if counted.old_active + counted.old_stopping == 0 and len(counted.new_running) >= counted.target:
        state.upgrade = None
        if state.failed:
            version = state.serving_spec.code_version
            actions.append(Log(logging.WARNING, f"{state.spec.id}: back on version {version}"))
        else:
            state.previous = None  # the version it replaced is gone
            finished = f"{state.spec.id}: upgrade to {state.spec.code_version} finished"
            actions.append(Log(logging.INFO, finished))
    return actions


def _move_off(state: DeploymentState, now: float, draining: Draining) -> list[Action]:
    """Replicas of the serving version on leaving nodes keep serving until successors run
    elsewhere (the census does not count them, so they get successors), then drain; any
    replica there drains anyway once its node's deadline is near. Starts placed there are
    abandoned at once (Ray places nothing new on a leaving node)."""
    if not draining:
        return []
    version = state.serving_spec.code_version
    here = [r for r in state.replicas.values() if r.node_id in draining and not r.stop_requested]
    if not here:
        return []
    starting = [r for r in here if r.state is ReplicaState.STARTING]
    running_elsewhere = sum(
        1 for r in state.replicas.values() if r.version == version and r.serving and r.node_id not in draining
    )
    config = state.spec.config
    ours = sorted(
        (r for r in here if r.version == version and r.state is ReplicaState.RUNNING),
        key=lambda r: _leave_by(r, config, draining),
    )
    going = starting + ours[: max(running_elsewhere + len(ours) - state.target, 0)]
    going += [r for r in here if r not in going and now >= _leave_by(r, config, draining)]
    actions: list[Action] = []
    for replica in going:
        where = f"{replica.replica_id} off node {replica.node_id[:12]}"
        actions.append(Log(logging.INFO, f"{state.spec.id}: draining {where}"))
        # Its drain ends in time for the node: its streams' last events before the node goes.
        left = max(draining[replica.node_id].deadline - now - LEAVE_MARGIN_S, 0.0)
        actions += apply_event(
            state, replica.replica_id, Stop(grace_s=left if left < math.inf else None), now
        )
    return actions


def _leave_by(replica: Replica, config: DeploymentConfig, draining: Draining) -> float:
    """When a replica on a leaving node drains, successor or not: ``SUCCESSOR_WAIT_S``
    after the node began leaving, or earlier if it must to be done before the node's
    deadline (``config``: the deployment's, for a replica whose own is not known yet)."""
    grace = (replica.config or config).graceful_shutdown_timeout_s
    leaving = draining[replica.node_id]
    return min(leaving.since + SUCCESSOR_WAIT_S, leaving.deadline - grace - LEAVE_MARGIN_S)
