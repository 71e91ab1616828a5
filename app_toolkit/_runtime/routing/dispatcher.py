"""The caller-side queue of one deployment: wait for a free replica, send, retry.

The first of the three queues (docs/architecture.md, "Queues"). Requests wait here
(bounded by ``max_queued_requests``, in its ``waiting_line.WaitingLine``) until the
chooser finds a replica with a free slot; a request refused by a replica or not
delivered because the replica is gone is retried on another, since it never started.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence

from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.messages import (
    DeploymentID,
    Rejected,
    ReplicaInfo,
    ReplicaLost,
    Request,
    StreamContinuation,
    share_of,
)
from app_toolkit._runtime.request_values import Share
from app_toolkit._runtime.routing import caller_metrics
from app_toolkit._runtime.routing.choice import (
    Affinity,
    ReplicaChooser,
    choose_variant,
    pending_request,
    queue_bound,
    queue_is_full,
)
from app_toolkit._runtime.routing.replica_client import Connect, ReplicaClient, Reply
from app_toolkit._runtime.routing.shadow import Shadower
from app_toolkit._runtime.routing.tally import VariantTally, failed
from app_toolkit._runtime.routing.waiting_line import WaitingLine
from app_toolkit._runtime.tables import Outcomes, RouterChoice, ShadowTarget
from app_toolkit.exceptions import BackPressureError, ReplicaUnavailableError, RequestLostError
from app_toolkit.request_router import PendingRequest

logger = logging.getLogger("app_toolkit.router")

_MAX_DELIVERY_FAILURES = 3


#: Called with each exchange a request opens, before its first answer is awaited (the
#: proxy streams a request body into it).
OnOpen = Callable[[Exchange], None]


class Dispatcher:
    """Routes one caller's requests for one deployment."""

    def __init__(
        self,
        deployment: DeploymentID,
        connect: Connect,
        on_demand: Callable[[], None] | None = None,
        resolve: Callable[[DeploymentID], Dispatcher] | None = None,
        *,
        lost_error: type[RequestLostError],
    ) -> None:
        self.deployment = deployment
        self._connect = connect
        #: What a request lost with its replica raises (the backend's: on Ray, also Ray's
        #: RayActorError, as Ray Serve raises).
        self._lost_error = lost_error
        # The dispatchers of other deployments (a traffic split's variants).
        self._resolve = resolve
        self._split: tuple[tuple[DeploymentID, float], ...] = ()
        self._rng = random.Random()
        # Per variant application of the split: what its requests did since the last report.
        self._outcomes: dict[str, VariantTally] = {}
        self._shadower: Shadower | None = None  # made when a shadow is first set
        #: Requests go by a traffic policy (a split or a shadow): a caller must send them
        #: through :meth:`send`, and no ingress replica serves them in its own process.
        #: Set when a table arrives, read per request.
        self.has_policy = False
        self._handoffs: dict[str, tuple[str, ...]] = {}  # node id -> hand-off paths there
        # Called when a request waits and there is no replica at all (scale from zero).
        self._on_demand = on_demand
        self._chooser = ReplicaChooser()
        self._clients: dict[str, ReplicaClient] = {}
        # Requests in flight per replica, and clients of replicas that left the table but
        # still finish requests (a draining replica): closed after their last reply.
        self._active: dict[str, int] = {}
        self._retiring: dict[str, ReplicaClient] = {}
        self._line = WaitingLine(self._chooser)  # requests waiting for a free replica
        # Unknown until the first table arrives: up to QUEUE_CAP queue meanwhile, and the
        # first table refuses those beyond its bound (WaitingLine.refuse_beyond).
        self.max_queued_requests = -1
        self._has_table = False
        self._overload: tuple[int, float | None] = (503, 1.0)  # backpressure_config's answer
        self._closed_reason: str | None = None
        self._continuations: dict[str, StreamContinuation] = {}  # method -> its rules
        caller_metrics.track(self)

    # ------------------------------------------------------------------ table updates

    def update(
        self,
        replicas: Sequence[ReplicaInfo],
        max_queued_requests: int,
        affinity: Affinity = "strict",
        split: tuple[tuple[DeploymentID, float], ...] = (),
        shadow: ShadowTarget | None = None,
        overload: tuple[int, float | None] = (503, 1.0),
        router: RouterChoice | None = None,
        continuations: tuple[StreamContinuation, ...] = (),
    ) -> None:
        """Adopt the controller's newest replica table for this deployment."""
        self._closed_reason = None
        self._continuations = {rule.method: rule for rule in continuations}
        self._chooser.set_router(router)
        self.max_queued_requests = max_queued_requests
        self._overload = overload
        self._line.affinity = affinity
        self._split = split if self._resolve is not None else ()
        if shadow is not None and self._shadower is None and self._resolve is not None:
            self._shadower = Shadower(self.deployment, self._resolve)
        if self._shadower is not None:
            self._shadower.configure(shadow)
        self._chooser.set_replicas(replicas)
        self._tables_changed()
        live = {info.replica_id for info in replicas}
        for replica_id in list(self._clients):
            if replica_id not in live:
                self._retire(replica_id)
        self._line.wake()
        if not self._has_table:
            # Those that came before the caller knew the deployment's bound get what
            # they would have got had it known.
            self._has_table = True
            self._line.refuse_beyond(queue_bound(self.max_queued_requests), self._refusal)

    def close(self, reason: str) -> None:
        """The deployment is gone: fail everything that waits for it."""
        self._closed_reason = reason
        if self._shadower is not None:
            self._shadower.configure(None)
        self._chooser.set_replicas([])
        self._tables_changed()
        for replica_id in list(self._clients):
            self._retire(replica_id)
        self._line.fail_all(lambda: ReplicaUnavailableError(reason))

    def take_outcomes(self) -> Outcomes:
        """What the split's variants and the shadow copies did since the last call (for
        the controller)."""
        taken: Outcomes = tuple(
            tally.outcome(self.deployment.app, variant)
            for variant, tally in self._outcomes.items()
            if tally.requests
        )
        self._outcomes.clear()
        shadowed = self._shadower.take() if self._shadower is not None else None
        return (*taken, shadowed) if shadowed is not None else taken

    def handoffs(self, node_id: str) -> tuple[str, ...]:
        """The hand-off sockets of this deployment's replicas on node ``node_id`` (those
        that take client connections: direct ingress), as of the latest table."""
        found = self._handoffs.get(node_id)
        if found is None:
            found = self._handoffs[node_id] = tuple(
                info.handoff for info in self._chooser.infos() if info.handoff and info.node_id == node_id
            )
        return found

    def _tables_changed(self) -> None:
        self.has_policy = bool(self._split) or (self._shadower is not None and self._shadower.active)
        self._handoffs.clear()

    @property
    def affinity(self) -> Affinity:
        """Whether a request with a shard key waits for its own replica (the table's)."""
        return self._line.affinity

    @property
    def queued(self) -> int:
        return self._line.queued

    @property
    def in_flight(self) -> int:
        """Requests this caller sent to the replicas and that run now."""
        chooser = self._chooser
        return sum(chooser.sent(r) for r in chooser.replica_ids)

    def serving_here(self, replica_id: str, count: Callable[[], int]) -> Callable[[], None]:
        """``replica_id`` is this process's own replica (direct ingress), serving
        ``count()`` requests of its own connections: they count among its requests in
        flight when a replica is chosen, so this caller sends it nothing for the slots
        they hold (a request would come back busy, one hop later). What fills it from
        other callers is unseen here, as for any replica: a busy answer makes it skipped.
        Returns what to call when one of those requests ends (one waiting here may go)."""
        self._chooser.serving_here(replica_id, count)
        return self._slot_freed_here

    def _slot_freed_here(self) -> None:
        if self._line:
            self._line.wake()

    def continuation(self, method: str) -> StreamContinuation | None:
        """The rules by which a stream of ``method`` is continued (None: it is not)."""
        return self._continuations.get(method)

    @property
    def load(self) -> int:
        """Requests of this caller queued or running (streams and WebSockets included)."""
        return self.queued + sum(self._active.values())

    # ------------------------------------------------------------------ requests

    async def send(
        self,
        request: Request,
        model_id: str = "",
        shard_key: str = "",
        split: bool = True,
        on_open: OnOpen | None = None,
        on_refused: Callable[[], None] | None = None,
    ) -> Reply:
        """Deliver one request and wait for its first answer (or raise). A ``model_id``
        (multiplexing) prefers replicas that hold that model; a ``shard_key`` goes to the
        replica the key maps to (see ``choice.py``; ``affinity`` says whether it waits for
        that replica when it is full). With a traffic split, the request goes to one of
        its variants by weight (the same one for a shard key). ``on_open`` is given each
        exchange opened for it (a refused one too), before its first answer is awaited;
        ``on_refused`` is called when a replica refused it (it is sent elsewhere)."""
        shadower = self._shadower if self._shadower is not None and self._shadower.active else None
        if not split or (not self._split and shadower is None) or self._resolve is None:
            return await self._deliver(request, model_id, shard_key, on_open, on_refused)
        started = _now()
        if self._split:
            variant = choose_variant(self._split, shard_key, self._rng)
            caller_metrics.split_to(self.deployment, variant)
            target = self if variant == self.deployment else self._resolve(variant)
            tally = self._outcomes.setdefault(variant.app, VariantTally())
            try:
                reply = await target.send(
                    request, model_id, shard_key, split=False, on_open=on_open, on_refused=on_refused
                )
            except asyncio.CancelledError:
                raise
            except Exception:
                tally.add(_now() - started, error=True)
                raise
            tally.add(_now() - started, error=failed(reply.first))
        else:
            reply = await self._deliver(request, model_id, shard_key, on_open, on_refused)
        if shadower is not None:  # the primary is on its way: now the copy, maybe
            shadower.offer(request, model_id, reply, _now() - started)
        return reply

    async def _deliver(
        self,
        request: Request,
        model_id: str,
        shard_key: str,
        on_open: OnOpen | None = None,
        on_refused: Callable[[], None] | None = None,
    ) -> Reply:
        """Send to a replica of this deployment; retry on another while it never started."""
        failures = 0
        # What the deployment's request router reads: when it has one, or may have (the
        # first table, which names it, may come while the request waits).
        routed = self._chooser.router is not None or not self._has_table
        pending = pending_request(request) if routed else None
        share = share_of(request)
        while True:
            info = await self._acquire(model_id, shard_key, pending, share)
            try:
                reply = await self._open_on(info, request, on_open, on_refused)
            except RequestLostError:
                raise
            except ReplicaUnavailableError:
                failures += 1
                if failures >= _MAX_DELIVERY_FAILURES:
                    raise
                continue
            if isinstance(reply, Reply):
                if pending is not None and self._chooser.router is not None:
                    self._chooser.routed(pending, info.replica_id)
                return reply

    def replicas(self) -> list[ReplicaInfo]:
        """The replicas of the latest table that this caller can reach; raises
        ReplicaUnavailableError when the deployment is gone (none exist, as a call would)."""
        if self._closed_reason is not None:
            raise ReplicaUnavailableError(self._closed_reason)
        return self._chooser.infos()

    async def send_to(self, info: ReplicaInfo, request: Request) -> Reply | None:
        """Deliver ``request`` to replica ``info`` itself (a broadcast): past the queue and
        the chooser, with no retry elsewhere; the replica admits it even when full (a
        ``MethodCall`` marked ``broadcast``). None: the replica is draining (it takes no
        new work and is about to leave the table)."""
        if self._closed_reason is not None:
            raise ReplicaUnavailableError(self._closed_reason)
        self._chooser.acquire(info.replica_id)
        reply = await self._open_on(info, request)
        if isinstance(reply, Reply):
            return reply
        if reply.draining:
            return None
        raise ReplicaUnavailableError(f"Replica {info.replica_id} of {self.deployment} refused the request")

    async def _open_on(
        self,
        info: ReplicaInfo,
        request: Request,
        on_open: OnOpen | None = None,
        on_refused: Callable[[], None] | None = None,
    ) -> Reply | Rejected:
        """Open ``request`` on replica ``info``, whose slot the caller took, and wait for
        its first answer: the reply, or the replica's refusal (its slot given back; a
        draining replica is sent nothing more). Raises ReplicaUnavailableError when the
        replica cannot be reached (it is forgotten until a table brings it back), and
        RequestLostError when it was lost while it had the request."""
        client = self._clients.get(info.replica_id)
        if client is None:
            client = self._clients[info.replica_id] = self._connect(info)
        self._active[info.replica_id] = self._active.get(info.replica_id, 0) + 1
        try:
            exchange = await client.open(request)
        except ReplicaUnavailableError:
            self._lost(info.replica_id)
            self._release(info.replica_id)
            raise
        except BaseException:
            self._release(info.replica_id)
            raise
        if on_open is not None:
            on_open(exchange)
        try:
            first = await exchange.recv()
        except BaseException:
            exchange.cancel()
            self._release(info.replica_id)
            raise
        if isinstance(first, Rejected):
            if first.draining:
                # It is shutting down: send it nothing more, even while the table that
                # says so is late (a controller restarting), so it stops refusing and
                # can close without a request caught in flight.
                self._chooser.remove(info.replica_id)
                self._retire(info.replica_id)
            else:
                # Busy: skip it for a back-off; the wake-up after release comes back.
                self._chooser.rejected(info.replica_id, _now())
            self._release(info.replica_id)
            if on_refused is not None:
                on_refused()
            return first
        if isinstance(first, ReplicaLost):
            self._release(info.replica_id)
            raise self._lost_request(info.replica_id)
        self._chooser.succeeded(info.replica_id)
        return Reply(
            first, exchange, info.replica_id, self._release, self._lost_request, deployment=self.deployment
        )

    async def _acquire(
        self,
        model_id: str,
        shard_key: str = "",
        pending: PendingRequest | None = None,
        share: Share | None = None,
    ) -> ReplicaInfo:
        if self._closed_reason is not None:
            raise ReplicaUnavailableError(self._closed_reason)
        if not self._line:
            now = _now()
            choice = self._chooser.choose(now, model_id, shard_key, self.affinity, pending)
            if choice is not None:
                self._chooser.acquire(choice.replica_id, model_id, now)
                return choice
        if queue_is_full(self.queued, self.max_queued_requests) and not self._line.make_room(
            share, self._refusal
        ):
            raise self._refusal()
        waiter = self._line.join(model_id, shard_key, pending, share)
        self._line.wake()  # arms the back-off timer if a replica is only skipped for now
        if self._on_demand is not None and not self._chooser.replica_ids:
            self._on_demand()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._release(waiter.result().replica_id)
            raise

    def _refusal(self) -> BackPressureError:
        """A request refused because the queue is full (counted as refused)."""
        caller_metrics.rejected(self.deployment)
        bound = queue_bound(self.max_queued_requests)
        return BackPressureError(str(self.deployment), bound, *self._overload)

    def _release(self, replica_id: str) -> None:
        self._chooser.release(replica_id)
        active = self._active.get(replica_id, 0) - 1
        if active > 0:
            self._active[replica_id] = active
        else:
            self._active.pop(replica_id, None)
            retired = self._retiring.pop(replica_id, None)
            if retired is not None:
                retired.close()
        self._line.wake()

    def _retire(self, replica_id: str) -> None:
        """The replica left the table: close its connection once nothing uses it."""
        client = self._clients.pop(replica_id, None)
        if client is None:
            return
        if self._active.get(replica_id, 0) > 0:
            self._retiring[replica_id] = client
        else:
            client.close()

    def _lost_request(self, replica_id: str) -> RequestLostError:
        """Forget ``replica_id``, lost while it had a request; the error that request raises."""
        self._lost(replica_id)
        return self._lost_error(
            f"Replica {replica_id} of {self.deployment} was lost while it had the request; it may have run"
        )

    def suspect(self, replica_id: str) -> None:
        """Choose ``replica_id`` for none of this caller's requests for a while (its
        connection and its requests under way kept): it ended a stream as a lost replica
        would (its engine stopped), and the stream continues elsewhere."""
        self._chooser.suspect(replica_id, _now())
        self._line.wake()

    def _lost(self, replica_id: str) -> None:
        self._chooser.remove(replica_id)
        client = self._clients.pop(replica_id, None)
        if client is not None:
            client.close()
        self._line.wake()


def _now() -> float:
    return asyncio.get_running_loop().time()
