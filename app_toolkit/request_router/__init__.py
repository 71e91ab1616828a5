"""Request routers: which replica of a deployment a caller sends a request to (Ray Serve's
``RequestRouter`` interface, in the subset its routers use; docs/routing.md).

A deployment names its router in ``request_router_config`` (``request_router_class`` and
``request_router_kwargs``). Each caller (a proxy, a handle) makes its own instance, with no
argument, then calls :meth:`RequestRouter.initialize_state` with the kwargs. For each
request it calls :meth:`RequestRouter.choose_replicas`, which ranks the deployment's
replicas; the request goes to the replica with a free slot and the fewest of this caller's
requests in flight in the first rank that has one, else waits in the caller's queue and is
routed again when a slot frees. Methods are plain functions called on the caller's event
loop: they must be quick and never wait. A router that raises is logged, and the request
goes by power of two choices.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class RunningReplica:
    """A replica as routers see it."""

    replica_id: str
    #: The Ray node it runs on ("" on the local backend).
    node_id: str
    max_ongoing_requests: int
    #: The multiplexed models it reported holding.
    multiplexed_model_ids: frozenset[str] = frozenset()
    #: What its deployment's ``record_routing_stats()`` last returned (Ray Serve's name):
    #: sampled every ``request_routing_stats_period_s``, so up to that old; empty before
    #: the first result, or without the method. Read it, never change it. Not part of the
    #: replica's equality or hash (a replica stays the same replica as its stats move).
    routing_stats: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class PendingRequest:
    """A request about to be routed, as far as it has arrived.

    A handle call has its ``args`` and ``kwargs``. An HTTP request has none; ``body`` holds
    the body bytes that came with its head, whole when ``body_complete`` (a router reads
    no further: the body streams to the replica once it is chosen)."""

    request_id: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    multiplexed_model_id: str = ""
    body: bytes = b""
    body_complete: bool = False
    #: What routers derived from it, kept for the next time it is routed (a request that
    #: waits is ranked again at each free slot): name -> value.
    memo: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)


class RequestRouter:
    """The base of request routers: override :meth:`choose_replicas`, and the hooks you
    need. ``queue_len(replica_id)`` is this caller's requests in flight on a replica."""

    def __init__(self) -> None:
        self._queue_len: Callable[[str], int] = lambda replica_id: 0

    def initialize_state(self, **kwargs: Any) -> None:
        """Take ``request_router_kwargs`` (once, after construction)."""
        if kwargs:
            raise TypeError(f"{type(self).__name__} takes no request_router_kwargs, got {sorted(kwargs)}")

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """The deployment's replicas changed (a new table): ``replicas`` are all of them now."""

    def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        """Rank ``candidate_replicas`` for ``pending_request``: a list of ranks, best first."""
        raise NotImplementedError

    def on_request_routed(self, pending_request: PendingRequest, replica_id: str, result: Any = None) -> None:
        """``replica_id`` accepted ``pending_request`` (``result`` is always None here: the
        router hears of it before any answer)."""

    def on_replica_actor_died(self, replica_id: str) -> None:
        """``replica_id`` was lost (it leaves the next table too)."""

    def queue_len(self, replica_id: str) -> int:
        """This caller's requests in flight on ``replica_id``."""
        return self._queue_len(replica_id)

    def bind_queue_lens(self, queue_len: Callable[[str], int]) -> None:
        """Called by the caller that owns the router: where :meth:`queue_len` reads."""
        self._queue_len = queue_len


class PowerOfTwoChoicesRequestRouter(RequestRouter):
    """The default: two replicas at random, the one with fewer requests in flight first."""

    def __init__(self) -> None:
        super().__init__()
        self._rng = random.Random()

    def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        free = [r for r in candidate_replicas if self.queue_len(r.replica_id) < r.max_ongoing_requests]
        if len(free) < 2:
            return [free]
        pair = self._rng.sample(free, 2)
        pair.sort(key=lambda replica: self.queue_len(replica.replica_id))
        return [pair]


__all__ = ["PendingRequest", "PowerOfTwoChoicesRequestRouter", "RequestRouter", "RunningReplica"]
