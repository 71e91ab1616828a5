"""Request routers of a user's own, for the routing tests (importable by every caller)."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import app_toolkit as tk
from app_toolkit.request_router import PendingRequest, RequestRouter, RunningReplica


class LowestIdRouter(RequestRouter):
    """Ranks replicas by id; ``prefer`` (kwarg) first when given."""

    def initialize_state(self, prefer: str = "", **kwargs: Any) -> None:
        super().initialize_state(**kwargs)
        self.prefer = prefer
        self.routed: list[tuple[str, str]] = []
        self.replica_ids: list[str] = []

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        self.replica_ids = sorted(replica.replica_id for replica in replicas)

    def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        ordered = sorted(candidate_replicas, key=lambda replica: replica.replica_id)
        first = [replica for replica in ordered if replica.replica_id.startswith(self.prefer or "\0")]
        return [first, *([replica] for replica in ordered)]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: str, result: Any = None) -> None:
        self.routed.append((pending_request.request_id, replica_id))


class BrokenRouter(RequestRouter):
    def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        raise RuntimeError("broken on purpose")


class AsyncRouter(RequestRouter):
    async def choose_replicas(  # type: ignore[override]  # what the config refuses
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        return [candidate_replicas]


@tk.deployment(num_replicas=2, max_ongoing_requests=4)
class Conversations:
    """Answers which replica took each request (the prefix-aware router's tests)."""

    def answer(self, request: dict[str, Any]) -> str:
        return tk.get_replica_context().replica_id


class FlatRouter(RequestRouter):
    """Returns replicas where ranks (lists of them) are due: a router's bug."""

    def choose_replicas(  # type: ignore[override]  # the bug under test
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[RunningReplica]:
        return candidate_replicas


class StatsRouter(RequestRouter):
    """Records the routing stats it sees (the last table's, and the last request's
    candidates'), in the class: a test reads what the driver's router saw."""

    latest: ClassVar[dict[str, dict[str, Any]]] = {}
    chosen_from: ClassVar[dict[str, dict[str, Any]]] = {}

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        type(self).latest = {replica.replica_id: dict(replica.routing_stats) for replica in replicas}

    def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        type(self).chosen_from = {r.replica_id: dict(r.routing_stats) for r in candidate_replicas}
        return [candidate_replicas]


@tk.deployment(
    num_replicas=1,
    request_router_config={
        "request_router_class": StatsRouter,
        "request_routing_stats_period_s": 0.2,
        "request_routing_stats_timeout_s": 0.2,
    },
)
class Reporting:
    """Reports how many times its record_routing_stats() answered; ``misbehave`` makes
    the hook raise, or hang past its timeout, until it is told "answer" again."""

    def __init__(self) -> None:
        self.answered = 0
        self.mode = "answer"

    def misbehave(self, mode: str) -> str:
        self.mode = mode
        return tk.get_replica_context().replica_id

    async def record_routing_stats(self) -> dict[str, Any]:
        if self.mode == "raise":
            raise RuntimeError("stats broken on purpose")
        if self.mode == "hang":
            await asyncio.sleep(3600)  # cancelled at request_routing_stats_timeout_s
        self.answered += 1
        return {"answered": self.answered}
