"""What ``status()`` returns: applications → deployments → replicas, with states."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class ApplicationStatus(str, Enum):
    """Lifecycle of an application."""

    DEPLOYING = "DEPLOYING"
    RUNNING = "RUNNING"
    DEPLOY_FAILED = "DEPLOY_FAILED"
    DELETING = "DELETING"


class DeploymentStatus(str, Enum):
    """Lifecycle of a deployment."""

    UPDATING = "UPDATING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DEPLOY_FAILED = "DEPLOY_FAILED"


class ProxyStatus(str, Enum):
    """Whether a node's proxy serves (Ray Serve's values): STARTING until it first
    answers, HEALTHY, UNHEALTHY when it did not answer, DRAINING while its node leaves
    (it serves on; its ``/-/healthz`` says 503). DRAINED, Ray Serve's moment between a
    drained proxy and its removal, is never shown (in Ray Serve either)."""

    STARTING = "STARTING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"


class ReplicaState(str, Enum):
    """Lifecycle of a replica."""

    STARTING = "STARTING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"


@dataclass(frozen=True)
class ReplicaStatusInfo:
    """One replica."""

    replica_id: str
    state: ReplicaState
    code_version: str
    node_id: str = ""  # the Ray node it runs on, once started ("" on the local backend)
    models: tuple[str, ...] = ()  # multiplexed models it holds, least recently used first
    #: Its newest ``record_routing_stats()`` result, as routers read it (empty: none yet;
    #: an ``app_toolkit.llm`` model replica's name its engine).
    routing_stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AutoscalingStatusInfo:
    """Why an autoscaled deployment has the target it has."""

    current_load: float  # requests queued + running now, over all callers
    average_load: float  # over look_back_period_s: what decisions use
    last_decision_load: float | None  # the averaged load behind the last change of target
    last_decision_from: int | None
    last_decision_to: int | None
    last_decision_age_s: float | None  # seconds since that change
    #: A custom policy's import path (the deployment's, or its application's); None: the
    #: built-in policy on requests.
    policy: str | None = None
    #: The replicas' custom metrics (record_autoscaling_stats()) as the policy last saw
    #: them, aggregated over look_back_period_s: metric -> replica id -> value.
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    #: The newest sample of each, likewise.
    latest_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    #: The custom metrics behind the last change of target (None: no custom decision).
    last_decision_metrics: dict[str, dict[str, float]] | None = None


@dataclass(frozen=True)
class UpgradeStatusInfo:
    """A deployment's upgrade under way: replicas of its new version replacing older ones
    (docs/deployments.md). ("Rollout" names the canary of ``rollout()``.)"""

    to_version: str
    old_replicas: int  # replicas of older versions still serving
    new_replicas: int  # replicas of the new version running
    target_replicas: int
    #: surge: the new version starts beside the old one; steps: no room for that, old
    #: replicas are replaced a step at a time; rolling: Ray Serve's rolling_update_percentage
    #: and max_surge_percent; rollback: the new version failed to start, the one before
    #: it comes back.
    mode: str
    step: int  # the step under way (1-based), in steps and rolling; else 0
    steps: int  # steps it takes in all (of step_size replicas each), in steps and rolling; else 0
    step_size: int
    waiting_for: str  # e.g. "1 replica needs {'accel': 1.0}: none free"; "" for nothing
    age_s: float  # since it began

    def describe(self) -> str:
        """One line for people: counts, mode, step and what it waits for."""
        line = (
            f"upgrade to {self.to_version}: {self.new_replicas} new and {self.old_replicas} old "
            f"running, of {self.target_replicas}; {self.mode}"
        )
        if self.steps:
            size = f"{self.step_size} replica{'s' if self.step_size > 1 else ''}"
            line += f", step {self.step} of {self.steps} ({size} each)"
        return line + (f"; waiting for {self.waiting_for}" if self.waiting_for else "")


@dataclass(frozen=True)
class DeploymentStatusInfo:
    """One deployment and its replicas."""

    name: str
    status: DeploymentStatus
    message: str
    target_replicas: int
    replicas: list[ReplicaStatusInfo] = field(default_factory=list)
    autoscaling: AutoscalingStatusInfo | None = None  # None unless autoscaled
    #: Its calls' split between deployments of its application (set_traffic("app/Name",
    #: ...)): deployment -> share; empty when it takes them all.
    traffic: dict[str, float] = field(default_factory=dict)
    upgrade: UpgradeStatusInfo | None = None  # None unless a new version replaces replicas

    @property
    def running_replicas(self) -> int:
        return sum(1 for replica in self.replicas if replica.state is ReplicaState.RUNNING)

    @property
    def replica_states(self) -> dict[str, int]:
        """Count of replicas per state, e.g. ``{"RUNNING": 2}``."""
        counts: dict[str, int] = {}
        for replica in self.replicas:
            counts[replica.state.value] = counts.get(replica.state.value, 0) + 1
        return counts


@dataclass(frozen=True)
class RolloutStatusInfo:
    """A canary rollout of an application's traffic (``rollout()``)."""

    canary: str  # the application the traffic moves to
    steps: list[float]  # percent of the traffic to the canary, step by step
    step: int  # the step under way (or the last one)
    state: str  # RUNNING, DONE, ROLLED_BACK or STOPPED
    message: str  # why it rolled back or stopped
    canary_requests: int  # in the step under way
    canary_errors: int
    canary_p99_ms: float | None
    step_age_s: float  # since the step began
    history: list[str] = field(default_factory=list)  # each step's outcome


@dataclass(frozen=True)
class ShadowStatusInfo:
    """Copies of an application's requests sent to a shadow (``shadow()``), since it was
    set: how they did, and the latency of the shadow and of the primaries copied."""

    to: str
    fraction: float
    compare: str  # the function that compares answers ("module:function"; "": statuses only)
    copies: int  # answered (or failed) copies
    errors: int  # copies the shadow failed (5xx, raised, no replica)
    different: int  # copies whose answer (status, or failed vs not) differs from the primary's
    dropped: int  # copies not sent or given up: the shadow was busy or slow
    p50_ms: float | None
    p99_ms: float | None
    primary_p50_ms: float | None
    primary_p99_ms: float | None


@dataclass(frozen=True)
class ApplicationStatusInfo:
    """One application and its deployments."""

    name: str
    status: ApplicationStatus
    message: str
    route_prefix: str | None
    ingress: str
    deployments: dict[str, DeploymentStatusInfo] = field(default_factory=dict)
    #: Its traffic split (set_traffic): application -> share; empty when it takes it all.
    traffic: dict[str, float] = field(default_factory=dict)
    rollout: RolloutStatusInfo | None = None  # its latest rollout, if any
    shadow: ShadowStatusInfo | None = None  # the shadow its requests are copied to, if any


@dataclass(frozen=True)
class EventInfo:
    """Something the controller did or saw: a failed deploy, a replica replaced, an
    autoscaling decision (its log line, kept for status and the dashboard)."""

    time: float  # Unix time, seconds
    level: str  # INFO, WARNING or ERROR
    message: str


@dataclass(frozen=True)
class ServeStatus:
    """Everything the controller runs."""

    applications: dict[str, ApplicationStatusInfo] = field(default_factory=dict)
    #: Node id -> its proxy's status, as Ray Serve's ``status().proxies``.
    proxies: dict[str, ProxyStatus] = field(default_factory=dict)
    #: Node id -> the URL its proxy serves on (proxies that serve).
    proxy_urls: dict[str, str] = field(default_factory=dict)
    #: The controller's most recent events, oldest first (at most 50).
    events: list[EventInfo] = field(default_factory=list)
    #: Node id -> started processes ready there to become a new replica at once (Ray
    #: backend; ``APP_TOOLKIT_SPARE_REPLICAS`` per node, docs/autoscaling.md).
    spare_replicas: dict[str, int] = field(default_factory=dict)
    #: The config file's target_capacity (percent of every deployment's replicas), if set.
    target_capacity: float | None = None
    #: Nodes that are leaving (Ray drains them): their replicas move to other nodes.
    draining_nodes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (enums as their values)."""

        def plain(value: Any) -> Any:
            if isinstance(value, Enum):
                return value.value
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, list):
                return [plain(v) for v in value]
            return value

        data = plain(dataclasses.asdict(self))
        for app in data["applications"].values():
            for name, deployment in app["deployments"].items():
                deployment["replica_states"] = self.applications[app["name"]].deployments[name].replica_states
        return data  # type: ignore[no-any-return]

    def to_text(self) -> str:
        """A table for people: per application its deployments, with running / target
        replicas, replica states, load and the last autoscaling decision; then the proxies."""
        lines: list[str] = []
        for app in self.applications.values():
            prefix = app.route_prefix if app.route_prefix is not None else "(no HTTP)"
            lines.append(
                f"{app.name}  {app.status.value}  {prefix}" + (f"  — {app.message}" if app.message else "")
            )
            if app.traffic:
                shares = ", ".join(f"{name} {share:.0%}" for name, share in app.traffic.items())
                lines.append(f"  traffic: {shares}")
            if app.rollout is not None:
                lines.append("  " + _rollout_line(app.rollout))
            if app.shadow is not None:
                lines.append("  " + _shadow_line(app.shadow))
            rows = [("DEPLOYMENT", "STATUS", "REPLICAS", "STATES", "LOAD", "LAST SCALING")]
            rows += [_deployment_row(d) for d in app.deployments.values()]
            widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
            for row in rows:
                cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                lines.append(("  " + "  ".join(cells)).rstrip())
            lines += [f"  {d.name}: {d.upgrade.describe()}" for d in app.deployments.values() if d.upgrade]
            lines += [f"  {d.name}: {d.message}" for d in app.deployments.values() if d.message]
            lines += [
                f"  {d.name} traffic: "
                + ", ".join(f"{name} {share:.0%}" for name, share in d.traffic.items())
                for d in app.deployments.values()
                if d.traffic
            ]
        if not self.applications:
            lines.append("No applications.")
        for node, health in self.proxies.items():
            lines.append(f"proxy {self.proxy_urls.get(node, '-')}  {health.value}  (node {node[:12]})")
        if self.target_capacity is not None:
            lines.append(f"target capacity: {self.target_capacity:g} %")
        for node in self.draining_nodes:
            lines.append(f"node {node[:12]} is leaving: its replicas move to other nodes")
        for node, ready in self.spare_replicas.items():
            lines.append(f"spare replica processes: {ready} ready  (node {node[:12]})")
        problems = [event for event in self.events if event.level != "INFO"][-_PROBLEMS_SHOWN:]
        if problems:
            lines.append("Recent problems:")
            lines += [f"  {_clock(event.time)}  {event.level}  {event.message}" for event in problems]
        return "\n".join(lines)


_PROBLEMS_SHOWN = 5


def _shadow_line(shadow: ShadowStatusInfo) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f} ms"

    return (
        f"shadow {shadow.to} ({shadow.fraction:.0%}): {shadow.copies} copies, {shadow.errors} errors, "
        f"{shadow.different} different, {shadow.dropped} dropped; p99 {ms(shadow.p99_ms)} "
        f"(primary {ms(shadow.primary_p99_ms)})"
    )


def _rollout_line(rollout: RolloutStatusInfo) -> str:
    steps = "/".join(f"{s:g}" for s in rollout.steps)
    where = f"step {rollout.step + 1} of {len(rollout.steps)} ({rollout.steps[rollout.step]:g} %)"
    line = f"rollout to {rollout.canary} [{steps} %]: {rollout.state} at {where}"
    return line + (f" — {rollout.message}" if rollout.message else "")


def _clock(unix_time: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(unix_time))


def _metrics_text(metrics: dict[str, dict[str, float]]) -> str:
    """Custom metrics in a few words: each one's largest value over its replicas."""
    return ", ".join(
        f"{name} up to {max(values.values(), default=0.0):g} ({len(values)} replicas)"
        for name, values in metrics.items()
    )


def _deployment_row(info: DeploymentStatusInfo) -> tuple[str, str, str, str, str, str]:
    states = ", ".join(f"{count} {state}" for state, count in sorted(info.replica_states.items()))
    load = last = "-"
    scaling = info.autoscaling
    if scaling is not None:
        load = f"{scaling.current_load:g} (avg {scaling.average_load:.1f})"
        if scaling.last_decision_age_s is not None:
            last = (
                f"{scaling.last_decision_from} -> {scaling.last_decision_to} at load "
                f"{scaling.last_decision_load:.1f}, {scaling.last_decision_age_s:.0f} s ago"
            )
            if scaling.last_decision_metrics:
                last += " on " + _metrics_text(scaling.last_decision_metrics)
        if scaling.policy is not None:
            last += f" (policy {scaling.policy})"
    return (
        info.name,
        info.status.value,
        f"{info.running_replicas}/{info.target_replicas}",
        states or "-",
        load,
        last,
    )
