"""What callers and replicas report to the controller, each taken where it counts: a
caller's load per deployment (the autoscalers' input), what it saw of traffic splits'
variants (rollouts), its replicas' custom metrics (custom autoscaling policies) and
routing stats (the replica tables request routers read); a replica's multiplexed models
(the replica tables callers route by)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from app_toolkit._runtime.controller.custom_scaling import CustomScaling
from app_toolkit._runtime.controller.deployment_state import (
    DeploymentState,
    hold_models,
    hold_routing_stats,
)
from app_toolkit._runtime.controller.loads import LoadBook
from app_toolkit._runtime.controller.publishing import TablePublisher
from app_toolkit._runtime.controller.traffic import TrafficPolicy
from app_toolkit._runtime.messages import DeploymentID
from app_toolkit._runtime.tables import Loads, Outcomes, ReplicaRoutingStats, ReplicaStats


class Records(Protocol):
    """What the controller keeps that reports change."""

    deployments: dict[DeploymentID, DeploymentState]
    loads: LoadBook
    policy: TrafficPolicy
    custom: CustomScaling
    tables: TablePublisher


class ReportIntake:
    """Takes the reports of one controller's callers and replicas. ``traffic_seen`` is
    called when outcomes of traffic splits arrive (a rollout moves on them); ``wake``
    wakes the reconcile loop."""

    def __init__(self, records: Records, traffic_seen: Callable[[], None], wake: Callable[[], None]) -> None:
        self._records = records
        self._traffic_seen = traffic_seen
        self._wake = wake
        # Per replica, the sequence number of its last report of each kind (reports may
        # arrive out of order: Ray runs an async actor's calls concurrently).
        self._model_reports = _Sequences(records)
        self._routing_reports = _Sequences(records)

    def record_load(self, caller: str, loads: Loads, outcomes: Outcomes) -> None:
        """A caller's newest load per deployment (requests queued + running), what it saw
        of traffic splits' variants (for rollouts), and its replicas' custom metrics and
        routing stats (a table whose replicas' stats changed is published once)."""
        records = self._records
        now = asyncio.get_running_loop().time()
        records.loads.record(caller, loads, now)
        seen_traffic = False
        changed: set[DeploymentID] = set()
        for outcome in outcomes:
            if isinstance(outcome, ReplicaRoutingStats):
                if self._routing_reports.newer(outcome.replica_id, outcome.sequence):
                    state = records.deployments.get(outcome.deployment)
                    if state is not None and hold_routing_stats(state, outcome.replica_id, outcome.stats):
                        changed.add(outcome.deployment)
            elif isinstance(outcome, ReplicaStats):
                state = records.deployments.get(outcome.deployment)
                if state is not None and state.autoscaler is not None and not state.deleting:
                    records.custom.stats.record(outcome, now)  # late ones of a deleted deployment are dropped
            else:
                records.policy.record(outcome)
                seen_traffic = True
        for deployment in changed:  # once per deployment, however many of its replicas changed
            records.tables.replicas(deployment)
        if seen_traffic:
            self._traffic_seen()  # a canary that fails is rolled back now, not next tick
        for deployment, load in loads.items():
            state = records.deployments.get(deployment)
            if load and state is not None and state.autoscaler is not None and state.target == 0:
                self._wake()  # demand at zero replicas: scale up now, not next tick

    def note_models(self, replica_id: str, models: tuple[str, ...], sequence: int) -> None:
        """A replica's multiplexed models changed: callers route by them. Reports may
        arrive out of order (Ray runs an async actor's calls concurrently): ``sequence``
        counts a replica's reports, and an older one than the last is ignored. (Replicas
        on the controller's own loop report here directly.)"""
        if not self._model_reports.newer(replica_id, sequence):
            return
        for deployment_id, state in self._records.deployments.items():
            if replica_id in state.replicas:
                if hold_models(state, replica_id, tuple(models)):
                    self._records.tables.replicas(deployment_id)
                return


class _Sequences:
    """The sequence number of each replica's last report of one kind: ``newer`` says
    whether a report is newer than the last one taken (and takes it). Replicas that are
    gone are forgotten once the record doubles (it stays bounded by the live replicas, and
    the replicas are counted only then, not per report)."""

    def __init__(self, records: Records) -> None:
        self._records = records
        self._last: dict[str, int] = {}
        self._bound = 100

    def newer(self, replica_id: str, sequence: int) -> bool:
        if sequence <= self._last.get(replica_id, -1):
            return False
        self._last[replica_id] = sequence
        if len(self._last) > self._bound:
            live = {r for d in self._records.deployments.values() for r in d.replicas}
            self._last = {r: n for r, n in self._last.items() if r in live}
            self._bound = 2 * len(self._last) + 100
        return True
