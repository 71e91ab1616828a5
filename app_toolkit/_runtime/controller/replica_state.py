"""One replica's life as the controller sees it: a pure state machine.

``replica_transition(replica, event, spec, now) -> (replica, actions)``. The controller
performs the actions (start, stop, health-check or reconfigure a replica, publish the
replica table) and feeds their outcomes back as events. No I/O and no clock of its own:
tests drive it with plain numbers for ``now``.

    STARTING ──Started──► RUNNING ──Stop / failed checks / failed reconfigure──► STOPPING
        │                                                                          │
        └─Stop: its start is cancelled ──► STOPPING (a start that won the race      │
        │       first is stopped at Started)                             Stopped ──┴─► (gone)
        └─StartFailed ──► (gone)

While it starts, ``Placement`` events say whether Ray can place it now (an upgrade that
waits for room switches to steps: ``controller/upgrade.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import zlib
from dataclasses import dataclass

from app_toolkit._runtime.messages import DeploymentSpec, ReplicaInfo
from app_toolkit.config import DeploymentConfig
from app_toolkit.status import ReplicaState

#: A replica starting for longer than this is reported in status() and logged.
SLOW_START_S = 30.0


@dataclass(frozen=True, slots=True)
class Replica:
    """What the controller knows of one replica."""

    replica_id: str
    version: str
    state: ReplicaState = ReplicaState.STARTING
    info: ReplicaInfo | None = None
    handle: object = None  # the backend's handle (an actor, an object)
    stop_requested: bool = False
    next_health_check: float = 0.0
    checking: bool = False  # a health check is under way
    health_failures: int = 0  # consecutive
    config: DeploymentConfig | None = None  # the options the replica runs with
    reconfiguring: bool = False
    launched_at: float = 0.0  # controller clock
    slow_start_logged: bool = False
    rank: int = -1  # its place among the deployment's replicas (ReplicaInfo.rank)
    #: Its node's place among the nodes of its version's replicas, and its place among them
    #: on its node (assigned once its node is known; -1 before).
    node_rank: int = -1
    local_rank: int = -1
    node_id: str = ""  # where it runs, once placed ("" on the local backend)
    #: While starting: why the cluster cannot place it now ("" placed, or not known to wait),
    #: since when (controller clock), and whether no node could ever hold it.
    unplaced: str = ""
    unplaced_since: float = 0.0
    infeasible: bool = False
    #: Routing stats it reported before the backend told of its start (JSON, at most
    #: ``routing_stats.MAX_STATS_BYTES``): they go into its table entry at Started.
    early_routing_stats: str = ""

    @property
    def serving(self) -> bool:
        """In the replica table: running and not on its way out."""
        return self.state is ReplicaState.RUNNING and not self.stop_requested


# ------------------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class Started:
    """The backend started the replica."""

    info: ReplicaInfo
    handle: object
    config: DeploymentConfig


@dataclass(frozen=True, slots=True)
class StartFailed:
    """The replica could not start (constructor raised, process died, no room...)."""

    error: str


@dataclass(frozen=True, slots=True)
class Placement:
    """What the backend sees of a replica that is starting: ``reason`` why the cluster
    cannot place it now ("": it is placed, or waits for nothing the cluster lacks), and
    whether no node could hold it even when empty (``infeasible``)."""

    reason: str
    infeasible: bool = False


@dataclass(frozen=True, slots=True)
class Stop:
    """The controller wants the replica gone (scale down, new version, deletion).
    ``hurry``: its streams end when its drain starts (``app-toolkit run --reload``,
    shutdown); ``grace_s``: a shorter grace period than its own (its node leaves sooner)."""

    hurry: bool = False
    grace_s: float | None = None


@dataclass(frozen=True, slots=True)
class Stopped:
    """The backend stopped the replica."""


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: start a due health check or a needed reconfigure."""


@dataclass(frozen=True, slots=True)
class HealthPassed:
    pass


@dataclass(frozen=True, slots=True)
class HealthFailed:
    error: str
    gone: bool  # the process is gone: replace it at once
    hung: bool = False  # no answer in time: its event loop may be blocked, so it cannot drain


@dataclass(frozen=True, slots=True)
class Reconfigured:
    config: DeploymentConfig


@dataclass(frozen=True, slots=True)
class ReconfigureFailed:
    error: str


Event = (
    Started
    | StartFailed
    | Placement
    | Stop
    | Stopped
    | Tick
    | HealthPassed
    | HealthFailed
    | Reconfigured
    | ReconfigureFailed
)

# ----------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class StopReplica:
    replica_id: str
    handle: object
    graceful: bool
    #: How long a graceful stop may take before the replica is killed anyway.
    drain_timeout_s: float = 0.0
    #: Its streams and WebSockets end when the drain starts, not at its deadline.
    hurry: bool = False
    #: A grace period shorter than its own (None: its own).
    grace_s: float | None = None


@dataclass(frozen=True, slots=True)
class CancelStart:
    """Stop a replica that is still starting: its start is abandoned (an actor not
    placed yet never runs; one placed is killed). ``Stopped`` follows."""

    replica_id: str


#: What a drain may take beyond twice graceful_shutdown_timeout_s (in-flight work, then the
#: app's lifespan shutdown or ``__del__``): the moments for last events and for what
#: ``__del__`` ended (a second each), the replica's lingering for late requests, the calls.
_DRAIN_MARGIN_S = 10.0


def drain_timeout_s(config: DeploymentConfig | None, grace_s: float | None = None) -> float:
    """The longest a graceful stop of a replica running with ``config`` (with a grace
    period of ``grace_s`` if shorter) may take."""
    grace = (config or DeploymentConfig()).graceful_shutdown_timeout_s
    if grace_s is not None:
        grace = min(grace, grace_s)
    return 2 * grace + _DRAIN_MARGIN_S


@dataclass(frozen=True, slots=True)
class CheckHealth:
    replica_id: str
    handle: object
    timeout_s: float


@dataclass(frozen=True, slots=True)
class ReconfigureReplica:
    replica_id: str
    handle: object
    config: DeploymentConfig


@dataclass(frozen=True, slots=True)
class PublishReplicas:
    """The replica table changed: publish it to the callers."""


@dataclass(frozen=True, slots=True)
class Log:
    level: int
    message: str


@dataclass(frozen=True, slots=True)
class Replace:
    """A serving replica is being stopped because it failed; the plan starts another.
    ``reason``: gone, hung, unhealthy or reconfigure_failed."""

    reason: str


ReplicaAction = StopReplica | CancelStart | CheckHealth | ReconfigureReplica | PublishReplicas | Log | Replace


# ---------------------------------------------------------------------------- transition


def replica_transition(
    replica: Replica, event: Event, spec: DeploymentSpec, now: float
) -> tuple[Replica | None, list[ReplicaAction]]:
    """The replica after ``event`` (None once it is gone) and what to do about it.

    ``spec`` is the deployment's current desired state: its options time the health
    checks, and its code version and options decide whether a reconfigure is due.
    """
    config = spec.config
    if isinstance(event, Started):
        info = event.info
        if replica.early_routing_stats and not info.routing_stats:
            info = dataclasses.replace(info, routing_stats=replica.early_routing_stats)
        started = dataclasses.replace(
            replica,
            info=info,
            early_routing_stats="",
            handle=event.handle,
            config=event.config,
            node_id=info.node_id,
            unplaced="",
            infeasible=False,
        )
        if replica.stop_requested:  # asked to stop while it started: stop it now
            stopping = dataclasses.replace(started, state=ReplicaState.STOPPING)
            return stopping, [StopReplica(replica.replica_id, event.handle, graceful=False)]
        first_check = now + first_check_in(replica.replica_id, config.health_check_period_s)
        running = dataclasses.replace(started, state=ReplicaState.RUNNING, next_health_check=first_check)
        return running, [PublishReplicas()]
    if isinstance(event, StartFailed | Stopped):
        return None, []
    if isinstance(event, Placement):
        return _placement(replica, event, now), []
    if isinstance(event, Stop):
        return _stop(replica, hurry=event.hurry, grace_s=event.grace_s)
    if isinstance(event, Tick):
        return _tick(replica, spec, now)
    if isinstance(event, HealthPassed):
        checked = dataclasses.replace(
            replica, checking=False, health_failures=0, next_health_check=now + config.health_check_period_s
        )
        return checked, []
    if isinstance(event, HealthFailed):
        return _health_failed(replica, event, config, now)
    if isinstance(event, Reconfigured):
        return _reconfigured(replica, event.config)
    if isinstance(event, ReconfigureFailed):
        replica = dataclasses.replace(replica, reconfiguring=False)
        log = Log(
            logging.WARNING,
            f"Replica {replica.replica_id} could not be reconfigured ({event.error}); replacing it",
        )
        after, actions = _stop(replica)
        return after, [log, Replace("reconfigure_failed"), *actions] if actions else [log]
    raise TypeError(f"Unknown replica event {event!r}")


def first_check_in(replica_id: str, period_s: float) -> float:
    """Seconds from a replica's start to its first health check: half a period to a whole
    one, picked by its id. Replicas started together are then checked spread over the
    period, not all in the same pass of every period (thousands at once on a big deploy)."""
    return period_s * (0.5 + 0.5 * zlib.crc32(replica_id.encode()) / 2**32)


def _placement(replica: Replica, event: Placement, now: float) -> Replica:
    if replica.state is not ReplicaState.STARTING or replica.stop_requested:
        return replica
    if not event.reason:
        return dataclasses.replace(replica, unplaced="", infeasible=False)
    since = replica.unplaced_since if replica.unplaced else now
    return dataclasses.replace(
        replica, unplaced=event.reason, unplaced_since=since, infeasible=event.infeasible
    )


def _stop(
    replica: Replica, graceful: bool = True, hurry: bool = False, grace_s: float | None = None
) -> tuple[Replica, list[ReplicaAction]]:
    if replica.stop_requested:
        return replica, []
    if replica.state is ReplicaState.STARTING:
        # It serves nothing yet: its start is abandoned (a start that finishes first is
        # stopped when Started arrives).
        stopping = dataclasses.replace(replica, stop_requested=True, state=ReplicaState.STOPPING)
        return stopping, [CancelStart(replica.replica_id)]
    stopping = dataclasses.replace(replica, stop_requested=True, state=ReplicaState.STOPPING)
    drain_s = drain_timeout_s(replica.config, grace_s)
    stop = StopReplica(replica.replica_id, replica.handle, graceful, drain_s, hurry, grace_s)
    return stopping, [PublishReplicas(), stop]


def _tick(replica: Replica, spec: DeploymentSpec, now: float) -> tuple[Replica, list[ReplicaAction]]:
    actions: list[ReplicaAction] = []
    if replica.state is ReplicaState.RUNNING and not replica.checking and replica.next_health_check <= now:
        replica = dataclasses.replace(replica, checking=True)
        actions.append(CheckHealth(replica.replica_id, replica.handle, spec.config.health_check_timeout_s))
    if (
        replica.serving
        and not replica.reconfiguring
        and replica.version == spec.code_version
        and replica.config != spec.config
    ):
        replica = dataclasses.replace(replica, reconfiguring=True)
        actions.append(ReconfigureReplica(replica.replica_id, replica.handle, spec.config))
    return replica, actions


def _health_failed(
    replica: Replica, event: HealthFailed, config: DeploymentConfig, now: float
) -> tuple[Replica, list[ReplicaAction]]:
    threshold = config.health_check_failure_threshold
    if event.gone:
        failures = threshold
        log = Log(logging.WARNING, f"Replica {replica.replica_id} is gone ({event.error}); replacing it")
    else:
        failures = replica.health_failures + 1
        log = Log(logging.WARNING, f"Health check of {replica.replica_id} failed: {event.error}")
    replica = dataclasses.replace(
        replica,
        checking=False,
        health_failures=failures,
        next_health_check=now + config.health_check_period_s,
    )
    if failures < threshold or replica.stop_requested:
        return replica, [log]
    # One that stopped answering cannot drain: it is killed, which ends its requests.
    after, actions = _stop(replica, graceful=not event.hung)
    reason = "gone" if event.gone else "hung" if event.hung else "unhealthy"
    return after, [log, Replace(reason), *actions] if actions else [log]


def _reconfigured(replica: Replica, config: DeploymentConfig) -> tuple[Replica, list[ReplicaAction]]:
    replica = dataclasses.replace(replica, reconfiguring=False, config=config)
    info = replica.info
    if info is None or info.max_ongoing_requests == config.max_ongoing_requests:
        return replica, []
    # Callers must learn the new slot count.
    info = dataclasses.replace(info, max_ongoing_requests=config.max_ongoing_requests)
    return dataclasses.replace(replica, info=info), [PublishReplicas()]
