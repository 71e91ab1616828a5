"""What the controller knows of each deployment, and how it changes: pure transitions.

``apply_event(state, replica_id, event, now)`` moves one replica through its life
(``replica_state.py``) and keeps the deployment's own record (start failures, message,
whether any replica ever ran) in step, returning actions for the controller to perform;
``planning.py`` says what the deployment needs next. No I/O, no clock of its own.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import logging
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from app_toolkit._runtime.continuation_marks import waiting
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
    replica_transition,
)
from app_toolkit._runtime.messages import AdoptedReplica, DeploymentID, DeploymentSpec
from app_toolkit._runtime.request_context import ReplicaRank
from app_toolkit._runtime.tables import ReplicaTable, RouterChoice
from app_toolkit.status import ReplicaState

#: Failed starts of one version after which its deployment is DEPLOY_FAILED.
MAX_START_FAILURES = 3


@dataclass(frozen=True, slots=True)
class Leaving:
    """A node that is leaving: since when (controller clock), and when it goes (``inf``:
    no deadline)."""

    since: float
    deadline: float


#: Node id -> how it leaves.
Draining = Mapping[str, Leaving]


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
    """An upgrade under way: since when, how many old replicas its steps stopped and when
    the last one did, and whether the default surge found no room and went in steps."""

    since: float
    replaced: int = 0
    stepped_at: float = -math.inf
    #: When the last step's old replicas were gone (the room they held free).
    freed_at: float = -math.inf
    steps: bool = False


@dataclass(frozen=True)
class Lifecycle:
    """What a deployment's record holds beyond its spec and replicas, kept across a
    controller restart (the checkpoint): a failed version, what it falls back on, the
    upgrade under way."""

    failed: bool
    start_failures: int
    message: str
    previous: DeploymentSpec | None
    upgrade: Upgrade | None


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
    hurried: bool = False  # deleted by a shutdown: its replicas' streams end at once
    #: Deleted, it serves on until no replica of these may call it (controller/teardown.py).
    retire_after: frozenset[DeploymentID] = frozenset()
    autoscaler: Autoscaler | None = None
    #: The version that served before this one: what a failed upgrade goes back to.
    previous: DeploymentSpec | None = None
    upgrade: Upgrade | None = None
    #: The config file's target_capacity (controller/capacity.py).
    capacity: Capacity = field(default_factory=Capacity)

    @property
    def target(self) -> int:
        """Replicas wanted now: the autoscaler's target, else num_replicas of the version
        that should run (either at the target capacity)."""
        if self.autoscaler is not None:
            return self.autoscaler.target
        return self.capacity.scale(self.serving_spec.config.num_replicas)

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
        config = self.serving_spec.config
        return self.target if config.autoscaling_config is not None else config.num_replicas

    def lifecycle(self) -> Lifecycle:
        """This record's lifecycle, to checkpoint."""
        upgrade = copy.copy(self.upgrade)
        return Lifecycle(self.failed, self.start_failures, self.message, self.previous, upgrade)

    def restore(self, saved: Lifecycle) -> None:
        """Take back a checkpointed lifecycle (a restarted controller, same spec)."""
        self.failed, self.start_failures, self.message = saved.failed, saved.start_failures, saved.message
        self.previous, self.upgrade = saved.previous, copy.copy(saved.upgrade)


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
    if (
        isinstance(event, Started)
        and after is not None
        and after.state is ReplicaState.RUNNING
        and after.version == spec.code_version
    ):
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
        replica, node_id=node_id, node_rank=node_rank, local_rank=local_rank, unplaced="", infeasible=False
    )
    return ReplicaRank(replica.rank, node_rank, local_rank)


def _lowest_free(taken: set[int]) -> int:
    return next(rank for rank in itertools.count() if rank not in taken)


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


def hold_routing_stats(state: DeploymentState, replica_id: str, stats: str) -> bool:
    """A replica reported its routing stats (JSON); True if its table entry changed. Its
    load report may come before the backend tells of its start: then they wait for it."""
    replica = state.replicas.get(replica_id)
    if replica is not None and replica.info is None:
        state.replicas[replica_id] = dataclasses.replace(replica, early_routing_stats=stats)
        return False
    if replica is None or replica.info is None or replica.info.routing_stats == stats:
        return False
    state.replicas[replica_id] = dataclasses.replace(
        replica, info=dataclasses.replace(replica.info, routing_stats=stats)
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


def replica_table(state: DeploymentState) -> ReplicaTable:
    """What callers get: the serving replicas and how much they may queue."""
    infos = sorted(
        (r.info for r in state.replicas.values() if r.serving and r.info is not None),
        key=lambda info: info.replica_id,
    )
    # The configured bound from the first table on, a cold start included: requests within
    # it wait for the first replica, those beyond it are refused.
    config = state.spec.config
    overload = (config.backpressure_config.status_code, config.backpressure_config.retry_after_s)
    routing = config.request_router_config
    router = None
    if routing is not None and not routing.is_default:
        router = RouterChoice(routing.class_path, json.dumps(routing.request_router_kwargs, sort_keys=True))
    return ReplicaTable(
        tuple(infos),
        config.max_queued_requests,
        config.affinity,
        overload=overload,
        router=router,
        continuations=waiting(state.spec.continuations, config.continuation_wait_s),
    )


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
        before = state.autoscaler
        # A new initial_replicas is where the deployment starts again (Ray Serve's rule);
        # other changes keep its current count.
        restart = (
            config.initial_replicas is not None and config.initial_replicas != before.config.initial_replicas
        )
        state.autoscaler = Autoscaler(config, config.start_replicas if restart else before.target)
        state.autoscaler.hold(state.autoscaler.target)
    if state.autoscaler is not None and config is not None:
        state.autoscaler.bound(state.capacity.bounds(config) if state.capacity.percent is not None else None)


def keep_size(state: DeploymentState) -> None:
    """An autoscaled deployment that already has replicas keeps that many (within its
    bounds) instead of starting over from initial_replicas: as many as its largest version
    has (an upgrade under way runs two)."""
    per_version = Counter(r.version for r in state.replicas.values() if not r.stop_requested)
    if state.autoscaler is not None and per_version:
        state.autoscaler.hold(max(per_version.values()))


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
            f"{len(unplaced)} replica(s) cannot be placed yet: {'; '.join(reasons)}. Replicas "
            "already running keep serving. To place it, add a node with room for it, free room "
            "(scale another deployment down), or ask for less (ray_actor_options, "
            "placement_group_bundles, max_replicas_per_node)."
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
