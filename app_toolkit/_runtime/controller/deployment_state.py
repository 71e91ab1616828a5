"""What the controller knows of each deployment, and how it changes: pure transitions.

``apply_event(state, replica_id, event, now)`` moves one replica through its life
(``replica_state.py``) and keeps the deployment's own record (start failures, message,
whether any replica ever ran) in step; ``plan(state, now, new_id)`` says what the
deployment needs now (replicas to start or stop, health checks and reconfigures due).
Both return actions for the controller to perform; neither does I/O or reads a clock.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from app_toolkit._runtime.controller.autoscaling import Autoscaler
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
from app_toolkit._runtime.tables import ReplicaTable
from app_toolkit.status import ReplicaState

#: Failed starts of one version after which its deployment is DEPLOY_FAILED.
MAX_START_FAILURES = 3


@dataclass(frozen=True, slots=True)
class StartReplica:
    """Start the (already recorded) replica ``replica_id`` from ``spec``."""

    replica_id: str
    spec: DeploymentSpec
    rank: int = -1


@dataclass(frozen=True, slots=True)
class PublishGone:
    """The deployment cannot serve (deleted, or failed before any replica ran): callers
    waiting for it must fail rather than wait."""


Action = ReplicaAction | StartReplica | PublishGone


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

    @property
    def target(self) -> int:
        """Replicas wanted now: the autoscaler's target, else num_replicas."""
        if self.autoscaler is not None:
            return self.autoscaler.target
        return self.spec.config.num_replicas


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
        state.message = ""
    elif isinstance(event, StartFailed) and replica.version == spec.code_version:
        state.start_failures += 1
        state.message = f"Replica failed to start: {event.error}"
        if state.start_failures >= MAX_START_FAILURES and not state.failed:
            state.failed = True
            actions.append(Log(logging.ERROR, f"{spec.id} failed to deploy: {event.error}"))
            if not any(r.state is ReplicaState.RUNNING for r in state.replicas.values()):
                actions.append(PublishGone())
    elif isinstance(event, ReconfigureFailed):
        state.message = f"reconfigure() failed: {event.error}"
    return actions


# -------------------------------------------------------------------------------- plan


def plan(state: DeploymentState, now: float, new_id: Callable[[], str]) -> list[Action]:
    """What the deployment needs now: retire it if deleted; else start or stop replicas
    toward the target, replace an older version once the new one runs, start due health
    checks and reconfigures, and explain replicas slow to start."""
    if state.deleting:
        return _each(state, Stop(), now)
    actions = _scale(state, now, new_id)
    actions += _each(state, Tick(), now)
    newly_slow = [replica for replica in slow_starters(state, now) if not replica.slow_start_logged]
    for replica in newly_slow:
        state.replicas[replica.replica_id] = dataclasses.replace(replica, slow_start_logged=True)
    if newly_slow:  # one line for them all: the message counts every slow replica
        actions.append(Log(logging.WARNING, f"{state.spec.id}: {slow_start_message(state, now)}"))
    return actions


def next_due(state: DeploymentState) -> float:
    """When ``plan`` next has something to do if no event, deploy or new target comes
    first: the earliest health check due, or a start turning slow. Until then a plan would
    return nothing (the controller skips it: ``-inf`` means plan every pass)."""
    if state.deleting:
        return -math.inf
    due = math.inf
    for replica in state.replicas.values():
        if replica.state is ReplicaState.RUNNING and not replica.checking:
            due = min(due, replica.next_health_check)
        elif replica.state is ReplicaState.STARTING and not (
            replica.stop_requested or replica.slow_start_logged
        ):
            due = min(due, replica.launched_at + SLOW_START_S)
    return due


def _each(state: DeploymentState, event: Event, now: float) -> list[Action]:
    actions: list[Action] = []
    for replica_id in list(state.replicas):
        actions += apply_event(state, replica_id, event, now)
    return actions


def _current(state: DeploymentState) -> list[Replica]:
    """Replicas of the current code version that are not on their way out."""
    version = state.spec.code_version
    return [r for r in state.replicas.values() if r.version == version and not r.stop_requested]


def _scale(state: DeploymentState, now: float, new_id: Callable[[], str]) -> list[Action]:
    target = state.target
    current = _current(state)
    actions: list[Action] = []
    if len(current) < target and not state.failed:
        taken = {r.rank for r in current}
        free_ranks = (rank for rank in itertools.count() if rank not in taken)
        for _, rank in zip(range(target - len(current)), free_ranks, strict=False):
            replica_id = new_id()
            state.replicas[replica_id] = Replica(
                replica_id, state.spec.code_version, launched_at=now, rank=rank
            )
            actions.append(StartReplica(replica_id, state.spec, rank))
    elif len(current) > target:
        # Replicas still starting go first: they serve nothing yet.
        current.sort(key=lambda r: r.state is ReplicaState.RUNNING)
        for replica in current[: len(current) - target]:
            actions += apply_event(state, replica.replica_id, Stop(), now)
    running = sum(1 for r in _current(state) if r.state is ReplicaState.RUNNING)
    if running >= target and not state.failed:
        # Only once the new version is fully up do the old replicas go (a failed
        # rollout keeps them serving).
        version = state.spec.code_version
        for replica in [r for r in state.replicas.values() if r.version != version and not r.stop_requested]:
            actions += apply_event(state, replica.replica_id, Stop(), now)
    return actions


# ------------------------------------------------------------------------ other changes


def new_spec(state: DeploymentState, spec: DeploymentSpec) -> None:
    """A deploy changed the deployment's desired state."""
    if state.spec.code_version != spec.code_version:
        state.start_failures, state.failed, state.message = 0, False, ""
    state.spec = spec
    follow_autoscaling(state)


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


def keep_size(state: DeploymentState) -> None:
    """An autoscaled deployment that already has replicas keeps that many (within its
    bounds) instead of starting over from initial_replicas."""
    running = sum(1 for r in state.replicas.values() if not r.stop_requested)
    if state.autoscaler is not None and running:
        state.autoscaler.hold(running)


def only_starting(state: DeploymentState) -> bool:
    """Whether every replica left is still starting: none serves or drains (shutdown
    cancels their starts rather than wait for a constructor, a model loading)."""
    return all(r.state is ReplicaState.STARTING for r in state.replicas.values())


def slow_starters(state: DeploymentState, now: float) -> list[Replica]:
    """Replicas that have been starting for longer than ``SLOW_START_S``."""
    return [
        r
        for r in state.replicas.values()
        if r.state is ReplicaState.STARTING and not r.stop_requested and now - r.launched_at > SLOW_START_S
    ]


def slow_start_message(state: DeploymentState, now: float) -> str:
    """Why replicas may be slow to start, naming what each one asks the cluster for."""
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
