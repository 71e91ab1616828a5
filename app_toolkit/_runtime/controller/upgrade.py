"""How a deployment replaces the replicas of an older version: a pure policy.

``moves(census, options, now)`` says how many replicas of the new version to start and
which older ones to stop on this pass; ``waiting_for`` says what an upgrade waits for.
No I/O and no clock: the controller passes ``now``.

- **Ray Serve's steps**, when ``rolling_update_percentage`` or ``max_surge_percent`` is set
  (docs/deployments.md): without a surge, up to a step of old replicas stop and as many new
  ones start, the next step once those run; with a surge, up to the surge starts beside
  the old replicas and an old one stops only once the replicas running exceed the target.
  Step and surge are rounded as Ray Serve 2.60 rounds them.
- **The default**: the whole new version surges beside the old one, and an old replica
  stops as soon as a new one runs in its place, so serving capacity never dips. When a new
  replica has waited ``surge_timeout_s`` for room the cluster does not have, old replicas
  also go in steps of 20 %: a step stops, its successors take the room it frees, and the
  next step follows once they run — or, if the room a step freed holds no new replica (it
  asks for more than an old one held), once ``surge_timeout_s`` has passed with none
  placed. Room that appears meanwhile lets the surge finish. Steps are taken only when
  the old replicas hold what the new ones wait for (``Options.steps_help``).
- **A failed version** is rolled back with the default policy: the version that served
  before is the "new" one then (the controller builds the census so).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from app_toolkit._runtime.controller.replica_state import Replica

#: The share of the replicas each step replaces when the default surge finds no room.
DEFAULT_STEP = 0.2


@dataclass(frozen=True, slots=True)
class Census:
    """One deployment's replicas as an upgrade counts them (none asked to stop, except in
    ``old_stopping``), each group in the order it would be stopped in."""

    target: int
    new_starting: tuple[Replica, ...] = ()
    new_running: tuple[Replica, ...] = ()
    old_starting: tuple[Replica, ...] = ()
    old_running: tuple[Replica, ...] = ()
    old_stopping: int = 0  # old replicas draining or being stopped

    @property
    def new_active(self) -> int:
        return len(self.new_starting) + len(self.new_running)

    @property
    def old_active(self) -> int:
        return len(self.old_starting) + len(self.old_running)


@dataclass(frozen=True, slots=True)
class Options:
    """The deployment options an upgrade follows."""

    rolling_update_percentage: float | None = None
    max_surge_percent: int | None = None
    surge_timeout_s: float = 30.0
    #: The old replicas hold a resource the new ones ask for: stopping some can make room.
    steps_help: bool = True
    #: The new version has failed to start: the room a step freed taking none of its
    #: replicas says nothing of their size, so no further step follows on that account.
    failing: bool = False

    @property
    def ray_serve(self) -> bool:
        return self.rolling_update_percentage is not None or self.max_surge_percent is not None


@dataclass(frozen=True, slots=True)
class Moves:
    """What to do on this pass: start ``start`` new replicas, stop ``stop``; ``steps``:
    the default surge found no room and replaces in steps."""

    start: int = 0
    stop: tuple[Replica, ...] = ()
    steps: bool = False


def step_size(fraction: float, target: int) -> int:
    """Replicas one step replaces: Ray Serve's ``max(int(fraction * target), 1)``."""
    return max(int(fraction * target), 1)


def surge_size(percent: int, target: int) -> int:
    """Replicas a surge may add: ``percent`` of the target, rounded up (Ray Serve's)."""
    return (percent * target + 99) // 100


def moves(census: Census, options: Options, now: float, freed_at: float = -math.inf) -> Moves:
    """Starts and stops toward ``census.target`` replicas of the new version
    (``freed_at``: when the old replicas of the default policy's last step were gone)."""
    target = census.target
    if not census.old_active:
        return _resize(census)
    if target == 0:  # scaled to zero mid-upgrade: everything goes, old replicas first
        everything = census.old_starting + census.old_running + census.new_starting + census.new_running
        return Moves(stop=everything)
    if options.ray_serve:
        fraction = options.rolling_update_percentage or DEFAULT_STEP
        if not options.max_surge_percent:
            return _stepwise(census, step_size(fraction, target))
        return _surge(census, surge_size(options.max_surge_percent, target), step_size(fraction, target))
    surged = _surge(census, target, target)
    if not (options.steps_help and waits_for_room(census, options, now)):
        return surged
    step = step_size(DEFAULT_STEP, target)
    more = _next_step(census, step, surged.stop)
    if not more and not options.failing and _stuck(census, surged.stop, options, now, freed_at):
        more = tuple(r for r in census.old_running if r not in surged.stop)[:step]
    return Moves(surged.start, surged.stop + more, steps=True)


def waits_for_room(census: Census, options: Options, now: float) -> bool:
    """A new replica has waited ``surge_timeout_s`` for room the cluster lacks (room that
    stopping an old replica can make: not one no node could ever hold)."""
    timeout = options.surge_timeout_s
    return any(
        replica.unplaced and not replica.infeasible and now - replica.unplaced_since >= timeout
        for replica in census.new_starting
    )


def room_due(census: Census, options: Options, freed_at: float = -math.inf) -> float:
    """When the default policy next may have to step: a new replica waiting for room will
    have waited ``surge_timeout_s``, or that long will have passed since the last step's
    room was freed (the controller plans then); ``inf`` when none waits."""
    waits = [
        max(replica.unplaced_since, freed_at) + options.surge_timeout_s
        for replica in census.new_starting
        if replica.unplaced and not replica.infeasible
    ]
    return min(waits, default=math.inf)


def waiting_for(census: Census) -> str:
    """What the upgrade waits for, in words: room for new replicas, their starts, or old
    replicas draining ("" for nothing)."""
    reasons = Counter(replica.unplaced for replica in census.new_starting if replica.unplaced)
    if reasons:
        return "; ".join(
            f"{count} replica{'s' if count > 1 else ''} {reason}" for reason, count in reasons.items()
        )
    starting = len(census.new_starting)
    if starting:
        return f"{starting} new replica{'s' if starting > 1 else ''} starting"
    if census.old_stopping:
        return f"{census.old_stopping} old replica{'s' if census.old_stopping > 1 else ''} draining"
    return ""


def _resize(census: Census) -> Moves:
    """No older version left: start or stop new replicas toward the target (replicas still
    starting go first: they serve nothing yet)."""
    active = census.new_active
    if active < census.target:
        return Moves(start=census.target - active)
    return Moves(stop=(census.new_starting + census.new_running)[: active - census.target])


def _stepwise(census: Census, step: int) -> Moves:
    """Ray Serve without a surge: stop up to ``step`` old replicas less the steps' slots
    still in transition, and start as many new ones (a scale-down finishes first)."""
    target = census.target
    old = census.old_starting + census.old_running
    stop: tuple[Replica, ...] = ()
    if target >= census.old_active + census.old_stopping:
        pending = target - len(census.new_running) - census.old_active
        stop = old[: max(step - pending, 0)]
    active = census.new_active + census.old_active - len(stop)
    if active < target:
        return Moves(start=target - active, stop=stop)
    extra = [r for r in old if r not in stop] + list(census.new_starting + census.new_running)
    return Moves(stop=stop + tuple(extra[: active - target]))


def _surge(census: Census, surge: int, step: int) -> Moves:
    """Ray Serve's surge: start new replicas up to ``surge`` beyond the target; stop old
    ones, at most ``step`` a pass, those starting first and running ones only while the
    replicas running exceed the target."""
    target = census.target
    missing = target - census.new_active
    available = surge + target - census.new_active - census.old_active
    start = max(0, min(missing, available))
    surplus = max(len(census.new_running) + len(census.old_running) - target, 0)
    stop = census.old_starting[:step]
    batch = step - len(stop)
    stop += census.old_running[: min(batch, surplus)]
    return Moves(start=start, stop=stop)


def _stuck(
    census: Census, stopping: tuple[Replica, ...], options: Options, now: float, freed_at: float
) -> bool:
    """The room the last step freed took none of the new replicas waiting for it (each
    asks for more than an old one held): no new replica is starting in it, nothing old is
    still stopping, and ``surge_timeout_s`` has passed since that room was freed."""
    return (
        not stopping
        and census.target >= census.old_active
        and census.old_stopping == 0
        and all(replica.unplaced for replica in census.new_starting)
        and now - freed_at >= options.surge_timeout_s
    )


def _next_step(census: Census, step: int, stopping: tuple[Replica, ...]) -> tuple[Replica, ...]:
    """The default policy's step when the surge has no room: stop up to ``step`` running
    old replicas (beyond ``stopping``, already chosen), less the slots of earlier steps
    still in transition (replicas stopping, or successors not running yet)."""
    target = census.target
    if target < census.old_active + census.old_stopping:
        return ()
    left = census.old_active - len(stopping)
    pending = target - len(census.new_running) - left
    candidates = [replica for replica in census.old_running if replica not in stopping]
    return tuple(candidates[: max(step - pending, 0)])
