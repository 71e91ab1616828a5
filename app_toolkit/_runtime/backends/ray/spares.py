"""Spare replica processes: a few started replica actors per node that wait to be given
a replica, so that a new replica (scale from zero, an autoscaling step, a replacement)
starts in the time its own code takes, not a new process's.

A fresh replica costs a Ray worker process: the interpreter, Ray's worker set-up and the
toolkit's imports, about 0.7 s of a core before the deployment's code runs. A spare has
paid that already. Spares reserve nothing (no CPU, one byte of memory, like a replica with
default options), so they never keep a real replica from being scheduled; only replicas
that ask for nothing more can use one (``fits``). By default each node keeps one spare
while a deployment that could start in one autoscales (a fixed-size application gets
none: its replicas start once and the spare would only hold memory);
``APP_TOOLKIT_SPARE_REPLICAS`` set to 1–8 keeps that many per node whatever runs, 0 none.
A ready spare also loads the code of the deployments that could start in it (``preload``:
their modules' imports run ahead, at most ``_PRELOAD_MAX`` deployments), so a replica
started in it only runs its constructor. One given away is replaced in the background
once no replica is starting or stopping (and ``_REFILL_AFTER_S`` after the last did).
They are named, detached actors like replicas (a spare becomes a replica that must
outlive a controller restart), so the controller finds its previous life's spares and
stops them, and shutdown stops every one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from app_toolkit._runtime.backends.ray.cluster import NAMESPACE, SPARE_PREFIX, SPARES_ENV, remote
from app_toolkit._runtime.backends.ray.nodes import NodeWatch
from app_toolkit._runtime.controller.deployment_state import DeploymentState
from app_toolkit.config import DeploymentConfig
from app_toolkit.exceptions import ConfigError

logger = logging.getLogger("app_toolkit.ray")

_DEFAULT_PER_NODE = 1
_MAX_PER_NODE = 8
_CHECK_PERIOD_S = 1.0
#: A spare that is not up after this long is stopped and started again.
_READY_TIMEOUT_S = 60.0
#: A ready spare is asked this often whether it is still alive (a dead one is replaced,
#: and status() does not count it), and must answer within the timeout.
_ALIVE_PERIOD_S = 10.0
_ALIVE_TIMEOUT_S = 10.0
#: A spare is replaced when no replica is starting in a process of its own or stopping,
#: and this long after the last one did (or started in a spare): a rollout or scale-up
#: under way starts its replicas, and the old ones drain (their __del__, stop hooks),
#: before a new process takes CPU from them; the pause covers the controller's next
#: step (a rollout stops an old replica once its successor runs).
_REFILL_AFTER_S = 1.0
#: With the default setting, spares stop this long after the last deployment that could
#: use one stopped autoscaling (an application deleted and deployed again keeps them).
_UNWANTED_AFTER_S = 10.0
#: A spare loads the code of at most this many deployments ahead (each one's imports stay
#: in the process, and so in the replica it becomes).
_PRELOAD_MAX = 16


@dataclass(frozen=True)
class SpareSetting:
    """How many spares each node keeps, and whether only while they can be used."""

    per_node: int
    #: Set explicitly: kept whatever runs. Else only while a deployment that could start
    #: in one autoscales (``code_to_preload`` finds one).
    always: bool


def spare_setting() -> SpareSetting:
    """The pool's setting, from ``APP_TOOLKIT_SPARE_REPLICAS`` (ConfigError if invalid)."""
    raw = os.environ.get(SPARES_ENV, "").strip()
    if not raw:
        return SpareSetting(_DEFAULT_PER_NODE, always=False)
    try:
        count = int(raw)
    except ValueError:
        count = -1
    if not 0 <= count <= _MAX_PER_NODE:
        raise ConfigError(
            f"{SPARES_ENV}={raw!r}: set it to a whole number from 0 (no spare replica processes) "
            f"to {_MAX_PER_NODE} (spares kept ready on each node), or leave it unset (one per "
            "node while an application autoscales)"
        )
    return SpareSetting(count, always=True)


def fits(config: DeploymentConfig) -> bool:
    """Whether a replica of ``config`` can run in a spare: it reserves no more than a
    spare does, needs no environment of its own and goes nowhere in particular."""
    options = config.ray_actor_options
    return (
        config.max_replicas_per_node is None
        and config.placement_group_bundles is None
        and options.num_cpus == 0
        and options.num_gpus == 0
        and not options.resources
        and not options.memory
        and options.runtime_env is None
    )


def _wants_spares(state: DeploymentState) -> bool:
    return state.autoscaler is not None and not state.deleting and fits(state.spec.config)


def code_to_preload(deployments: Iterable[DeploymentState]) -> dict[str, bytes]:
    """The serialized code of the deployments whose replicas would start in a spare, by
    deployment and code version; at most ``_PRELOAD_MAX``. Empty: no spare is wanted (no
    deployment that could start in one autoscales; a fixed-size one starts its replicas
    once)."""
    code = {
        f"{state.spec.id}@{state.spec.code_version}": state.spec.definition
        for state in deployments
        if _wants_spares(state)
    }
    return dict(sorted(code.items())[:_PRELOAD_MAX])


@dataclass
class _Spare:
    name: str
    node: str
    actor: Any
    ready: asyncio.Future[object] = field(repr=False)
    #: The last liveness check of a ready spare (None: none yet), and when it was made.
    alive: asyncio.Future[object] | None = field(default=None, repr=False)
    checked_at: float = 0.0
    #: The code (``code_to_preload`` keys) it was asked to load ahead.
    preloaded: set[str] = field(default_factory=set)


class SparePool:
    """Keeps ``per_node`` started spares on every alive node (with the default setting,
    only while ``code()`` names a deployment that could use one), has them load that
    code ahead; ``take`` gives one away."""

    def __init__(
        self,
        actor_class: type,
        setting: SpareSetting,
        code: Callable[[], dict[str, bytes]],
        nodes: NodeWatch,
    ) -> None:
        self._actor_class = actor_class
        self._nodes = nodes
        self.per_node = setting.per_node
        self._always = setting.always
        self._code = code  # what ready spares load ahead (``code_to_preload``)
        self._needed_at = 0.0  # when ``code()`` last named a deployment (monotonic)
        self._spares: dict[str, list[_Spare]] = {}  # node id -> its spares, oldest first
        self._keeper: asyncio.Task[None] | None = None
        self._turn = 0
        #: Replicas starting in fresh processes or stopping now: spares are replaced only
        #: when there are none, so replacing one never slows a replica starting or draining.
        self._busy = 0
        self._busy_at = 0.0  # when a replica last started or stopped

    def start(self) -> None:
        """Start the spares, and keep them (a node that joins gets its own)."""
        if self.per_node and self._keeper is None:
            self._keeper = asyncio.get_running_loop().create_task(self._keep())

    def counts(self) -> dict[str, int]:
        """Node id -> spares ready there now (what ``status()`` shows)."""
        return {
            node: sum(1 for spare in spares if _up(spare)) for node, spares in self._spares.items() if spares
        }

    def take(self, config: DeploymentConfig) -> tuple[Any, str] | None:
        """A spare's actor, and its node, for a replica of ``config`` (None: start a fresh
        one). A ready spare first, from the node that has the most; otherwise one still
        starting (it is ahead of a fresh process). Never one on a node that is leaving."""
        if not fits(config):
            return None
        leaving = self._nodes.draining
        nodes = [node for node, spares in self._spares.items() if spares and node not in leaving]
        if not nodes:
            return None
        # Ties go round the nodes, so replicas started one after another spread.
        self._turn += 1
        nodes = nodes[self._turn % len(nodes) :] + nodes[: self._turn % len(nodes)]
        spares = self._spares[max(nodes, key=lambda n: sum(1 for s in self._spares[n] if _up(s)))]
        spare = next((s for s in spares if _up(s)), spares[0])
        spares.remove(spare)
        self._busy_at = time.monotonic()
        return spare.actor, spare.node

    def release(self, node: str) -> None:
        """Stop the spares of a node that is leaving (and start none there)."""
        for spare in self._spares.pop(node, []):
            _discard(spare)

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Around the start of a replica in a process of its own, or a replica's stop."""
        self._busy += 1
        try:
            yield
        finally:
            self._busy -= 1
            self._busy_at = time.monotonic()

    async def stop(self) -> None:
        """Stop keeping spares and stop every one (at shutdown)."""
        if self._keeper is not None:
            self._keeper.cancel()
            self._keeper = None
        for spares in self._spares.values():
            for spare in spares:
                _discard(spare)
        self._spares.clear()

    # ------------------------------------------------------------------ keeping

    async def _keep(self) -> None:
        while True:
            try:
                await self._fill()
            except Exception:
                logger.exception("Keeping the spare replica processes failed; trying again")
            await asyncio.sleep(_CHECK_PERIOD_S)

    def _target(self, code: dict[str, bytes]) -> tuple[int, bool]:
        """Spares each node keeps now, and whether missing ones may be started."""
        now = time.monotonic()
        if self._always or code:
            self._needed_at = now
            return self.per_node, True
        if now - self._needed_at < _UNWANTED_AFTER_S:
            return self.per_node, False  # for a while: an app deployed again soon uses them
        return 0, False

    async def _fill(self) -> None:
        code = self._code()
        per_node, grow = self._target(code)
        alive = (await self._nodes.refresh()).serving  # none on a node that is leaving
        for node in [node for node in self._spares if node not in alive]:
            for spare in self._spares.pop(node):
                _discard(spare)
        for node in alive:
            spares = self._spares.setdefault(node, [])
            for spare in [s for s in spares if s.ready.done() and not _up(s)]:
                logger.info("Spare %s died or did not start; starting another", spare.name)
                spares.remove(spare)
                _discard(spare)
            if len(spares) > per_node:
                logger.info(
                    "No deployment that could use a spare replica process autoscales: stopping %d",
                    len(spares) - per_node,
                )
            while len(spares) > per_node:
                _discard(spares.pop())
            for spare in spares:
                _check_alive(spare, self._actor_pinged)
                _preload(spare, code)
            settled = not self._busy and time.monotonic() - self._busy_at >= _REFILL_AFTER_S
            while grow and len(spares) < per_node and settled:
                spares.append(self._new_spare(node))

    @staticmethod
    def _actor_pinged(actor: Any, timeout_s: float) -> asyncio.Future[object]:
        future = asyncio.ensure_future(asyncio.wait_for(actor.stats.remote(), timeout_s))
        future.add_done_callback(_consume)  # a failure is read by the next check
        return future

    def _new_spare(self, node: str) -> _Spare:
        name = f"{SPARE_PREFIX}{secrets.token_hex(4)}"
        actor = remote(
            self._actor_class,
            name=name,
            namespace=NAMESPACE,
            lifetime="detached",
            memory=1,  # as a replica with default options asks (replicas.py)
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        ).remote()
        return _Spare(name, node, actor, self._actor_pinged(actor, _READY_TIMEOUT_S))


def _discard(spare: _Spare) -> None:
    for check in (spare.ready, spare.alive):
        if check is not None:
            check.cancel()
    ray.kill(spare.actor, no_restart=True)


def _answered(future: asyncio.Future[object]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def _up(spare: _Spare) -> bool:
    """Started, and not found dead since."""
    alive = spare.alive
    return _answered(spare.ready) and (alive is None or not alive.done() or _answered(alive))


def _check_alive(spare: _Spare, ping: Callable[[Any, float], asyncio.Future[object]]) -> None:
    """Ask a ready spare again whether it lives, every ``_ALIVE_PERIOD_S``; a spare that
    did not answer the last time stays down (``_up``) and the next fill replaces it."""
    now = time.monotonic()
    if not _up(spare) or now - spare.checked_at < _ALIVE_PERIOD_S:
        return
    if spare.alive is None or spare.alive.done():
        spare.alive, spare.checked_at = ping(spare.actor, _ALIVE_TIMEOUT_S), now


def _preload(spare: _Spare, code: dict[str, bytes]) -> None:
    """Have a ready spare load the code it has not been given yet (a deployment that
    fails to load is skipped there: its replica's own start reports why)."""
    missing = [key for key in code if key not in spare.preloaded]
    if not missing or not _up(spare):
        return
    spare.preloaded.update(missing)
    future = asyncio.ensure_future(spare.actor.preload.remote({key: code[key] for key in missing}))
    future.add_done_callback(_consume)


def _consume(future: asyncio.Future[object]) -> None:
    if not future.cancelled():
        future.exception()
