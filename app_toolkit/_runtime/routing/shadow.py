"""Shadow traffic: a copy of a share of one deployment's requests goes to a shadow
deployment; its answers are compared with the primary's and thrown away.

The primary never waits for its shadow. A copy is offered only once the primary has
its first frame. It waits in a bounded queue, and a few workers send the copies, each
with a deadline. A copy that finds the queue full, or that outlasts its deadline, is
dropped and counted. Streams (streamed calls, WebSockets) are not copied; an HTTP
response that turns out to be streamed is compared on its status alone.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import random
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

from app_toolkit._runtime.channel.exchange import Exchange
from app_toolkit._runtime.messages import (
    Answer,
    CallResult,
    DeploymentID,
    HTTPRequest,
    HTTPResponse,
    MethodCall,
    Request,
)
from app_toolkit._runtime.routing.tally import ShadowTally, answer_of, failed
from app_toolkit._runtime.tables import ShadowOutcome, ShadowTarget
from app_toolkit.import_path import import_attr

logger = logging.getLogger("app_toolkit.router")

#: Copies waiting to be sent, per caller and shadowed deployment; more are dropped.
QUEUE_BOUND = 64
#: Copies in flight at once, per caller and shadowed deployment.
WORKERS = 4
#: A copy whose first frame takes longer is dropped (its request cancelled).
COPY_TIMEOUT_S = 5.0


#: What a user's compare function gets: two response bodies, or two call results.
Compare = Callable[[Any, Any], object]


class _Reply(Protocol):
    """The dispatcher's reply (dispatcher.py imports this module)."""

    first: Answer
    exchange: Exchange

    def release(self) -> None: ...


class _Sender(Protocol):
    async def send(
        self, request: Request, model_id: str = "", shard_key: str = "", split: bool = True
    ) -> _Reply: ...


@dataclasses.dataclass(frozen=True, slots=True)
class _Copy:
    request: HTTPRequest | MethodCall
    model_id: str
    primary_answer: str
    primary_seconds: float
    primary_body: object = None  # kept only when a compare function is set


class Shadower:
    """Copies a share of one deployment's requests (as one caller sends them) to its
    shadow. ``configure`` turns it on, retargets it or turns it off."""

    def __init__(self, endpoint: DeploymentID, resolve: Callable[[DeploymentID], _Sender]) -> None:
        self._endpoint = endpoint
        self._resolve = resolve
        self._target: DeploymentID | None = None
        self._fraction = 0.0
        self._compare_path = ""
        self._compare: Compare | None = None
        self._queue: collections.deque[_Copy] = collections.deque()
        self._ready = asyncio.Event()
        self._workers: list[asyncio.Task[None]] = []
        self._rng = random.Random()
        self.tally = ShadowTally()

    @property
    def active(self) -> bool:
        return self._target is not None

    def configure(self, shadow: ShadowTarget | None) -> None:
        target = shadow.deployment if shadow is not None else None
        if target != self._target:
            self.close()
        self._target = target
        self._fraction = shadow.fraction if shadow is not None else 0.0
        compare = shadow.compare if shadow is not None else ""
        if compare != self._compare_path:
            self._compare_path, self._compare = compare, _load_compare(compare)

    def offer(self, request: Request, model_id: str, reply: _Reply, primary_seconds: float) -> None:
        """The primary was dispatched: copy it to the shadow (``fraction`` of the time),
        unless it is a stream (a streamed response, or a body streamed to the primary) or
        the queue is full."""
        if self._target is None or self._rng.random() >= self._fraction:
            return
        if not isinstance(request, HTTPRequest | MethodCall) or (
            request.stream if isinstance(request, MethodCall) else request.more_body
        ):
            return
        if len(self._queue) >= QUEUE_BOUND:
            self.tally.dropped += 1
            return
        body = _body_of(reply.first) if self._compare is not None else None
        # The copy runs under a request id of its own (the shadow's logs tell it apart).
        copy_request = dataclasses.replace(request, request_id=request.request_id + "-shadow")
        copy = _Copy(copy_request, model_id, answer_of(reply.first), primary_seconds, body)
        self._queue.append(copy)
        self._ready.set()
        if not self._workers:
            loop = asyncio.get_running_loop()
            self._workers = [loop.create_task(self._work()) for _ in range(WORKERS)]

    def take(self) -> ShadowOutcome | None:
        """What the copies did since the last call (None: nothing)."""
        if self._target is None or not (self.tally.copies or self.tally.dropped):
            return None
        taken = self.tally.outcome(self._endpoint.app, self._target.app)
        self.tally = ShadowTally()
        return taken

    def close(self) -> None:
        for worker in self._workers:
            worker.cancel()
        self._workers = []
        self.tally.dropped += len(self._queue)
        self._queue.clear()

    async def _work(self) -> None:
        while True:
            if not self._queue:
                self._ready.clear()
                await self._ready.wait()
                continue
            copy = self._queue.popleft()
            target = self._target
            if target is None:
                continue
            await self._send(target, copy)

    async def _send(self, target: DeploymentID, copy: _Copy) -> None:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(COPY_TIMEOUT_S):
                reply = await self._resolve(target).send(copy.request, copy.model_id, split=False)
        except TimeoutError:
            self.tally.dropped += 1
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the shadow failing is what is measured
            logger.debug("Shadow copy to %s failed: %r", target, exc)
            seconds = time.perf_counter() - started
            self.tally.add(seconds, copy.primary_seconds, True, copy.primary_answer != "failed")
            return
        seconds = time.perf_counter() - started
        try:
            different = answer_of(reply.first) != copy.primary_answer
            body = _body_of(reply.first)
            if not different and self._compare is not None and None not in (copy.primary_body, body):
                different = not self._agree(copy.primary_body, body)
            self.tally.add(seconds, copy.primary_seconds, failed(reply.first), different)
        finally:
            reply.exchange.cancel()  # a streamed answer is not read further
            reply.release()

    def _agree(self, primary: object, shadow: object) -> bool:
        assert self._compare is not None
        try:
            return bool(self._compare(primary, shadow))
        except Exception as exc:  # noqa: BLE001 - the user's function failing counts as a difference
            logger.debug("The shadow's compare function %s raised %r", self._compare_path, exc)
            return False


def _load_compare(path: str) -> Compare | None:
    """The compare function ``path`` names, imported in this caller's process; None (and
    an error logged once) when it cannot be: statuses are still compared."""
    if not path:
        return None
    try:
        found = import_attr(path)
    except Exception as exc:  # noqa: BLE001 - an import error must not break routing
        logger.error(
            "The shadow's compare %r cannot be imported here (%s); comparing statuses only",
            path,
            exc,
        )
        return None
    if not callable(found):
        logger.error("The shadow's compare %r is not a function; comparing statuses only", path)
        return None
    return cast(Compare, found)


def _body_of(first: Answer) -> object:
    """What a compare function gets: an HTTP response's body, or a call's result. None
    for a streamed response or a failure (their statuses alone are compared)."""
    if isinstance(first, HTTPResponse):
        return first.body
    if isinstance(first, CallResult):
        return first.value
    return None
