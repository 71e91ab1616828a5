"""Replica choice: power of two choices on the caller's own in-flight counts, or the
replica a shard key maps to.

Pure: no I/O, no clock of its own (callers pass ``now``), no ray, no fastapi. The caller
counts what it sent to each replica; no probe RPC is made per request. A replica that
turned a request away (full because of other callers, or draining) is skipped for a short,
growing back-off.

Shard keys use rendezvous (highest random weight) hashing: a key goes to the replica with
the highest score of hash(key, replica rank). Every caller computes the same scores (the
hash is not Python's per-process ``hash``), keys spread evenly, and when a replica joins
or leaves only the keys whose best replica it is move. A replacement takes the rank of
the replica it replaces, so it gets back that replica's keys and no others. (Two replicas
share a rank during a rolling upgrade: the table's order breaks the tie, the same for
every caller.)

A deployment with a request router of its own (``request_router_config``) has its other
requests ranked by it (``app_toolkit.request_router``): the first rank with a free
replica gets the request, to the one of them with the fewest requests in flight.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from app_toolkit._runtime.messages import DeploymentID, HTTPRequest, MethodCall, ReplicaInfo, Request
from app_toolkit._runtime.tables import RouterChoice
from app_toolkit.request_router import PendingRequest, RequestRouter, RunningReplica
from app_toolkit.request_router.loading import make_router

logger = logging.getLogger("app_toolkit.router")

_BACKOFF_START_S = 0.002
#: How long a replica that ended a request as a lost one would is skipped (``suspect``).
SUSPECT_S = 5.0
_BACKOFF_MAX_S = 0.1
_MASK = (1 << 64) - 1

#: With a shard key: wait for the key's replica when it is full, or fall back to another.
Affinity = Literal["strict", "prefer"]


def stable_hash(text: str) -> int:
    """64 bits of ``text``, the same in every process."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _score(key_hash: int, replica_seed: int) -> int:
    """The rendezvous weight of a key on a replica (splitmix64's finaliser of both)."""
    z = (key_hash ^ replica_seed) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


#: For this long after sending a request for a model to a replica, the caller counts the
#: replica as holding it (it loads it), until its own report reaches the replica table.
MODEL_HINT_S = 5.0
_MAX_HINTS = 256  # per replica
#: A failing request router is logged at most this often (each failure routes by power of two).
_ROUTER_LOG_S = 60.0


@dataclass
class _Replica:
    info: ReplicaInfo
    in_flight: int = 0  # requests this caller sent it that run now
    blocked_until: float = 0.0
    backoff_s: float = 0.0
    sent: dict[str, float] = field(default_factory=dict)  # model id -> when last sent here
    seed: int = 0  # for shard keys: stable_hash of its rank (of its id if it has none)

    running: RunningReplica = field(init=False)  # as request routers see it

    def __post_init__(self) -> None:
        rank = self.info.rank
        self.seed = stable_hash(f"rank {rank}" if rank >= 0 else self.info.replica_id)
        self.running = _running(self.info)

    #: This process's own replica (direct ingress): the requests it serves here, read
    #: when a choice is made (no cost per request served).
    here: Callable[[], int] | None = None

    def load(self) -> int:
        """Its requests running as this caller knows them."""
        here = self.here
        return self.in_flight if here is None else self.in_flight + here()

    def free(self, now: float) -> bool:
        return self.load() < self.info.max_ongoing_requests and self.blocked_until <= now

    def holds(self, model_id: str, now: float) -> bool:
        return model_id in self.info.models or self.sent.get(model_id, -MODEL_HINT_S) > now - MODEL_HINT_S

    def model_count(self, now: float) -> int:
        """Models it holds or is loading as far as this caller knows."""
        recent = {model for model, at in self.sent.items() if at > now - MODEL_HINT_S}
        return len(recent.union(self.info.models))


class ReplicaChooser:
    """Tracks the replicas of one deployment as one caller sees them."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._replicas: dict[str, _Replica] = {}
        self._rng = rng or random.Random()
        self._choice: RouterChoice | None = None
        #: The deployment's request router (None: power of two choices here).
        self.router: RequestRouter | None = None
        self._router_failed_at = -_ROUTER_LOG_S
        #: This process's own replica (direct ingress) and how many requests it serves.
        self._here: tuple[str, Callable[[], int]] | None = None

    def set_replicas(self, infos: Iterable[ReplicaInfo]) -> None:
        """Adopt a new replica table; counts of replicas that stay are kept."""
        fresh: dict[str, _Replica] = {}
        for info in infos:
            known = self._replicas.get(info.replica_id)
            if known is not None:
                if known.info != info:
                    known.info, known.running = info, _running(info)
                fresh[info.replica_id] = known
            else:
                fresh[info.replica_id] = _Replica(info)
        self._replicas = fresh
        self._count_here()
        self._tell_router("update_replicas", [replica.running for replica in fresh.values()])

    def set_router(self, choice: RouterChoice | None) -> None:
        """Route by the request router ``choice`` names (None: power of two choices). A
        router this process cannot make is logged, and power of two choices route."""
        if choice == self._choice:
            return
        self._choice, self.router = choice, None
        if choice is None:
            return
        try:
            router = make_router(choice.path, json.loads(choice.kwargs))
            router.bind_queue_lens(self.in_flight)
        except Exception as exc:  # noqa: BLE001 - whatever its import raised: logged, never fatal
            logger.error("Routing by power of two choices: the request router cannot be made here: %s", exc)
            return
        self.router = router
        self._tell_router("update_replicas", [replica.running for replica in self._replicas.values()])

    def remove(self, replica_id: str) -> None:
        """Forget a replica that cannot be reached (until a table brings it back)."""
        if self._replicas.pop(replica_id, None) is not None:
            self._tell_router("on_replica_actor_died", replica_id)

    @property
    def replica_ids(self) -> list[str]:
        return list(self._replicas)

    def infos(self) -> list[ReplicaInfo]:
        """The replicas as the latest table described them."""
        return [replica.info for replica in self._replicas.values()]

    def in_flight(self, replica_id: str) -> int:
        replica = self._replicas.get(replica_id)
        return replica.load() if replica else 0

    def sent(self, replica_id: str) -> int:
        """Requests this caller sent to ``replica_id`` that run now."""
        replica = self._replicas.get(replica_id)
        return replica.in_flight if replica else 0

    def serving_here(self, replica_id: str, count: Callable[[], int]) -> None:
        """``replica_id`` is this process's own replica, serving ``count()`` requests of
        its own connections (see ``Dispatcher.serving_here``)."""
        self._here = (replica_id, count)
        self._count_here()

    def _count_here(self) -> None:
        if self._here is not None:
            replica = self._replicas.get(self._here[0])
            if replica is not None:
                replica.here = self._here[1]

    def owner(self, shard_key: str) -> ReplicaInfo | None:
        """The replica ``shard_key`` maps to (None without replicas)."""
        replica = self._owner(stable_hash(shard_key))
        return replica.info if replica is not None else None

    def _owner(self, key_hash: int) -> _Replica | None:
        return max(self._replicas.values(), key=lambda r: _score(key_hash, r.seed), default=None)

    def choose(
        self,
        now: float,
        model_id: str = "",
        shard_key: str = "",
        affinity: Affinity = "strict",
        pending: PendingRequest | None = None,
    ) -> ReplicaInfo | None:
        """Pick a replica with a free slot, or None if every replica is busy or blocked.

        For a multiplexed ``model_id``: a replica holding the model if one is free, else
        one holding the fewest models (the least likely to evict one in use). For a
        ``shard_key``: the key's replica; when it is not free, None (``strict``: wait for
        it) or another as without a key (``prefer``). Other requests of a deployment with
        a request router: as its ranks of ``pending`` say.
        """
        if shard_key:
            owner = self._owner(stable_hash(shard_key))
            if owner is not None and owner.free(now):
                return owner.info
            if affinity == "strict":
                return None
        elif self.router is not None and not model_id:
            routed = self._routed(now, pending)
            if routed is not False:
                return routed
        free = [r for r in self._replicas.values() if r.free(now)]
        if model_id and free:
            holders = [r for r in free if r.holds(model_id, now)]
            if holders:
                free = holders
            else:
                counts = {r.info.replica_id: r.model_count(now) for r in free}
                fewest = min(counts.values())
                free = [r for r in free if counts[r.info.replica_id] == fewest]
        if not free:
            return None
        if len(free) == 1:
            return free[0].info
        first, second = self._rng.sample(free, 2)
        return (first if first.load() <= second.load() else second).info

    def _routed(self, now: float, pending: PendingRequest | None) -> ReplicaInfo | Literal[False] | None:
        """The request router's choice: the free replica with the fewest requests in
        flight in its first rank that has one; None: none is free (wait); False: the
        router failed (logged; power of two choices route)."""
        router = self.router
        assert router is not None
        candidates = [r.running for r in self._replicas.values() if r.blocked_until <= now]
        if not candidates:
            return None
        try:
            for rank in router.choose_replicas(candidates, pending):
                free = [
                    replica
                    for replica in (self._replicas.get(running.replica_id) for running in rank)
                    if replica is not None and replica.free(now)
                ]
                if free:
                    return min(free, key=lambda replica: replica.load()).info
        except Exception:  # noqa: BLE001 - a router never breaks serving (STYLE 11); logged there
            self._router_failed(now)
            return False
        return None

    def _router_failed(self, now: float) -> None:
        if now - self._router_failed_at >= _ROUTER_LOG_S:
            self._router_failed_at = now
            logger.exception(
                "The request router %s failed; routing by power of two choices (logged once a minute)",
                self._choice.path if self._choice else "?",
            )

    def _tell_router(self, hook: str, *args: object) -> None:
        if self.router is None:
            return
        try:
            getattr(self.router, hook)(*args)
        except Exception:  # a router never breaks serving (STYLE 11)
            logger.exception("The request router's %s failed", hook)

    def any_free(self, now: float) -> bool:
        """Some replica has a free slot and is not skipped."""
        return any(r.free(now) for r in self._replicas.values())

    def next_unblock(self, now: float) -> float | None:
        """When the earliest skipped replica with a free slot may be chosen again."""
        times = [
            r.blocked_until
            for r in self._replicas.values()
            if r.blocked_until > now and r.load() < r.info.max_ongoing_requests
        ]
        return min(times) if times else None

    def routed(self, pending: PendingRequest, replica_id: str) -> None:
        """The replica accepted ``pending``: its router hears of it."""
        self._tell_router("on_request_routed", pending, replica_id)

    def acquire(self, replica_id: str, model_id: str = "", now: float = 0.0) -> None:
        replica = self._replicas.get(replica_id)
        if replica is not None:
            replica.in_flight += 1
            if model_id:
                replica.sent[model_id] = now
                if len(replica.sent) > _MAX_HINTS:  # model ids come from clients: keep a bound
                    fresh = sorted(replica.sent.items(), key=lambda item: item[1])[-_MAX_HINTS // 2 :]
                    replica.sent = {model: at for model, at in fresh if at > now - MODEL_HINT_S}

    def release(self, replica_id: str) -> None:
        replica = self._replicas.get(replica_id)
        if replica is not None and replica.in_flight > 0:
            replica.in_flight -= 1

    def succeeded(self, replica_id: str) -> None:
        """The replica accepted a request: reset its back-off."""
        replica = self._replicas.get(replica_id)
        if replica is not None:
            replica.backoff_s = 0.0

    def suspect(self, replica_id: str, now: float) -> None:
        """The replica ended a request as a lost one would (its engine stopped): skipped
        for :data:`SUSPECT_S` (its health checks take it out meanwhile if it is broken)."""
        replica = self._replicas.get(replica_id)
        if replica is not None:
            replica.blocked_until = max(replica.blocked_until, now + SUSPECT_S)

    def rejected(self, replica_id: str, now: float) -> float:
        """The replica turned a request away; returns how long it is skipped."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return 0.0
        replica.backoff_s = min(max(replica.backoff_s * 2, _BACKOFF_START_S), _BACKOFF_MAX_S)
        replica.blocked_until = now + replica.backoff_s
        return replica.backoff_s


def _running(info: ReplicaInfo) -> RunningReplica:
    """``info`` as request routers see it (made once per table that changes it)."""
    return RunningReplica(
        info.replica_id, info.node_id, info.max_ongoing_requests, frozenset(info.models), info.stats()
    )


def pending_request(request: Request) -> PendingRequest:
    """``request`` as request routers see it: a handle call's arguments, an HTTP request's
    body as far as it came with the head."""
    if isinstance(request, MethodCall):
        return PendingRequest(request.request_id, request.args, request.kwargs, request.model_id)
    if isinstance(request, HTTPRequest):
        return PendingRequest(request.request_id, body=request.body, body_complete=not request.more_body)
    return PendingRequest(getattr(request, "request_id", ""))


def choose_variant(
    split: tuple[tuple[DeploymentID, float], ...], shard_key: str, rng: random.Random
) -> DeploymentID:
    """The variant of a traffic split a request goes to: by its share, at random, or for
    a request with a shard key always the same one while the shares stay the same."""
    point = stable_hash("variant " + shard_key) / 2.0**64 if shard_key else rng.random()
    for deployment, share in split:
        point -= share
        if point < 0:
            return deployment
    return split[-1][0]


#: A caller's queue bound where the deployment sets none (``max_queued_requests=-1``, Ray
#: Serve's "no bound"), and before the caller's first routing table says what it sets.
QUEUE_CAP = 100_000


def queue_bound(max_queued_requests: int) -> int:
    """The requests a caller may queue for a deployment with ``max_queued_requests``."""
    return max_queued_requests if max_queued_requests >= 0 else QUEUE_CAP


def queue_is_full(waiting: int, max_queued_requests: int) -> bool:
    """Whether one more request would exceed the caller-side queue bound."""
    return waiting >= queue_bound(max_queued_requests)
